// SPDX-License-Identifier: Apache-2.0
#pragma once
/// BufferedReader and BufferedWriter: byte buffers between a TcpStream and a parser or a formatter.
///
/// BufferedReader keeps what arrived and was not consumed yet; a parser looks at view(), consumes
/// what it used and calls fill() for more. With a ProvidedBufferPool (net/provided_buffers.h) an
/// empty reader holds no memory at all while it waits: the kernel picks a buffer from the carrier's
/// ring when data arrives, the reader parses in place and gives the buffer back once consumed. Only
/// a message split across receives is copied, into a buffer of the reader's own (freed when it is
/// emptied again). With a pool, receives go through a MultishotReceiver by default: one receive
/// stays armed for the life of the connection (pass multishot = false for one receive per fill()).
/// Without a pool the reader allocates `capacity` bytes on its first fill().
///
/// BufferedWriter gathers small writes and sends them in one send on flush() (or when full).
/// Errors: fill() returns 0 at end of stream, ENOBUFS when the buffer is full (view().size() ==
/// capacity: the caller's message is larger than it allows: reject it), and the stream's errors.
/// Thread-safety: one fiber at a time.

#include <cstddef>
#include <memory>
#include <optional>
#include <string_view>

#include "base/result.h"
#include "core/deadline.h"
#include "net/provided_buffers.h"
#include "net/tcp.h"

namespace spindle::net {

class BufferedReader {
public:
    /// Reads from `stream` into up to `capacity` bytes (with a pool: up to `capacity` plus one pool
    /// buffer, since a provided buffer is taken whole). The stream must outlive the reader and stay
    /// open until the reader is destroyed: a multishot receive holds the socket until then.
    /// While the reader lives, receive from the stream only through it.
    explicit BufferedReader(TcpStream& stream, size_t capacity = 16 * 1024, ProvidedBufferPool* pool = nullptr,
                            bool multishot = true) noexcept;
    BufferedReader(const BufferedReader&) = delete;
    BufferedReader& operator=(const BufferedReader&) = delete;
    ~BufferedReader();

    /// Receives more bytes after those buffered; returns how many (0: end of stream).
    /// Errors: ENOBUFS when capacity bytes are buffered already; ENOMEM when received bytes could not
    /// be copied behind a split message (they are kept, and the next fill() appends them); the
    /// stream's errors.
    [[nodiscard]] Result<size_t> fill(Deadline deadline = {}) noexcept;
    /// The bytes received and not consumed.
    [[nodiscard]] std::string_view view() const noexcept { return {begin_, static_cast<size_t>(end_ - begin_)}; }
    [[nodiscard]] size_t size() const noexcept { return static_cast<size_t>(end_ - begin_); }
    /// Drops the first `n` buffered bytes. Precondition: n <= size().
    void consume(size_t n) noexcept;
    /// Copies up to `len` buffered bytes, receiving first when none are buffered; 0 at end of stream.
    [[nodiscard]] Result<size_t> read(void* dst, size_t len, Deadline deadline = {}) noexcept;
    /// Exactly `len` bytes (buffered ones first). Errors: ENODATA when the stream ends first.
    [[nodiscard]] Result<void> readExact(void* dst, size_t len, Deadline deadline = {}) noexcept;
    /// Bytes of memory the reader holds now (its own buffer and a provided one); 0 when idle with a pool.
    [[nodiscard]] size_t memoryHeld() const noexcept;
    [[nodiscard]] size_t capacity() const noexcept { return capacity_; }
    /// The multishot receiver in use, or null (no pool, multishot off, or no fill() yet).
    [[nodiscard]] const MultishotReceiver* receiver() const noexcept { return receiver_ ? &*receiver_ : nullptr; }
    [[nodiscard]] MultishotReceiver* receiver() noexcept { return receiver_ ? &*receiver_ : nullptr; }

private:
    void releaseIfEmpty() noexcept;
    TcpStream& stream_;
    ProvidedBufferPool* pool_;
    size_t capacity_;
    bool multishot_;
    std::optional<MultishotReceiver> receiver_;  // created on the first fill() with a pool
    ProvidedBuffer held_;  // received by a fill() that failed to copy it (ENOMEM); the next fill() takes it
    [[nodiscard]] bool ensureOwn(size_t need) noexcept;
    void compactOwn() noexcept;  // moves the unread bytes in own_ to its start
    std::unique_ptr<char[]> own_;   // the reader's own buffer, or null
    size_t ownCap_ = 0;
    ProvidedBuffer lease_;          // a provided buffer being parsed in place, or empty
    char* begin_ = nullptr;         // unread bytes: [begin_, end_) in own_ or lease_
    char* end_ = nullptr;
};

class BufferedWriter {
public:
    explicit BufferedWriter(TcpStream& stream, size_t capacity = 16 * 1024) noexcept;
    BufferedWriter(const BufferedWriter&) = delete;
    BufferedWriter& operator=(const BufferedWriter&) = delete;

    /// Appends `len` bytes, flushing first when they do not fit; a write larger than the capacity
    /// goes out directly after what is buffered. `*taken` (when given) says how many of the `len`
    /// bytes were buffered or sent: all of them on success. Errors: ENOMEM (no buffer; nothing
    /// taken), the stream's: the buffered bytes that did not leave stay buffered, and of the caller's
    /// bytes the first `*taken` left, so a retry passes only the rest (retrying all of them would send
    /// that prefix twice).
    [[nodiscard]] Result<void> write(const void* data, size_t len, Deadline deadline = {},
                                     size_t* taken = nullptr) noexcept;
    [[nodiscard]] Result<void> write(std::string_view s, Deadline deadline = {}, size_t* taken = nullptr) noexcept {
        return write(s.data(), s.size(), deadline, taken);
    }
    /// Sends everything buffered. Errors: the stream's; the unsent bytes stay buffered.
    [[nodiscard]] Result<void> flush(Deadline deadline = {}) noexcept;
    [[nodiscard]] size_t pending() const noexcept { return used_; }

private:
    TcpStream& stream_;
    size_t capacity_;
    std::unique_ptr<char[]> buf_;
    size_t used_ = 0;
};

}  // namespace spindle::net
