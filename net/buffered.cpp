// SPDX-License-Identifier: Apache-2.0
#include "net/buffered.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include "base/check.h"

namespace spindle::net {

// ---- BufferedReader ------------------------------------------------------------------------------

BufferedReader::BufferedReader(TcpStream& stream, size_t capacity, ProvidedBufferPool* pool, bool multishot) noexcept
    : stream_(stream), pool_(pool), capacity_(std::max<size_t>(capacity, 1)), multishot_(multishot) {}

BufferedReader::~BufferedReader() = default;

bool BufferedReader::ensureOwn(size_t need) noexcept {
    if (own_ && ownCap_ >= need) { return true; }
    const size_t cap = std::max(capacity_, need);
    std::unique_ptr<char[]> fresh(new (std::nothrow) char[cap]);
    if (!fresh) { return false; }
    const size_t n = size();
    if (n > 0) { std::memcpy(fresh.get(), begin_, n); }
    own_ = std::move(fresh);
    ownCap_ = cap;
    begin_ = own_.get();
    end_ = begin_ + n;
    lease_.release();  // whatever was parsed in place is in own_ now
    return true;
}

Result<size_t> BufferedReader::fill(Deadline deadline) noexcept {
    if (size() >= capacity_) { return Error{ENOBUFS}; }
    // A pool with no ring here for good (a refused registration): this reader's own buffer, as without one.
    if (pool_ != nullptr && held_.empty() && !receiver_ && lease_.empty() && !pool_->ringAvailable()) {
        pool_ = nullptr;
    }
    if (pool_ != nullptr) {
        Result<ProvidedBuffer> b = Error{EBADF};
        if (!held_.empty()) {
            b = std::move(held_);  // received by a fill() that could not copy it (ENOMEM)
        } else if (multishot_) {
            if (!receiver_) { receiver_.emplace(*pool_, stream_.fd()); }
            b = receiver_->next(deadline);
        } else {
            b = pool_->recv(stream_.fd(), deadline);
        }
        if (!b) { return Error{b.errorCode()}; }
        if (b->empty()) { return size_t{0}; }
        const size_t n = b->size();
        if (size() == 0 && lease_.empty() && !own_) {
            // Idle: parse in place, in the buffer the kernel picked.
            lease_ = std::move(*b);
            begin_ = lease_.data();
            end_ = begin_ + n;
            return n;
        }
        // A message split across receives: continue in a buffer of our own, behind what is there.
        if (!ensureOwn(size() + n)) {
            held_ = std::move(*b);  // the next fill() appends it: no byte is lost to the failure
            return Error{ENOMEM};
        }
        compactOwn();
        std::memcpy(end_, b->data(), n);
        end_ += n;
        return n;
    }
    if (!ensureOwn(size())) { return Error{ENOMEM}; }
    compactOwn();
    const size_t room = std::min(capacity_, ownCap_) - size();
    auto r = stream_.recv(end_, room, deadline);
    if (!r) { return r; }
    end_ += *r;
    return *r;
}

void BufferedReader::compactOwn() noexcept {
    if (begin_ == own_.get()) { return; }
    const size_t n = size();
    std::memmove(own_.get(), begin_, n);
    begin_ = own_.get();
    end_ = begin_ + n;
}

void BufferedReader::consume(size_t n) noexcept {
    SPINDLE_CHECK_MSG(n <= size(), "BufferedReader::consume past the buffered bytes");
    begin_ += n;
    releaseIfEmpty();
}

void BufferedReader::releaseIfEmpty() noexcept {
    if (begin_ != end_) { return; }
    lease_.release();
    if (pool_ != nullptr) {
        own_.reset();  // an idle reader with a pool holds nothing
        ownCap_ = 0;
        begin_ = end_ = nullptr;
    } else {
        begin_ = end_ = own_.get();
    }
}

Result<size_t> BufferedReader::read(void* dst, size_t len, Deadline deadline) noexcept {
    if (len == 0) { return size_t{0}; }
    if (size() == 0) {
        auto r = fill(deadline);
        if (!r) { return r; }
        if (*r == 0) { return size_t{0}; }
    }
    const size_t n = std::min(len, size());
    std::memcpy(dst, begin_, n);
    consume(n);
    return n;
}

Result<void> BufferedReader::readExact(void* dst, size_t len, Deadline deadline) noexcept {
    auto* p = static_cast<char*>(dst);
    while (len > 0) {
        auto r = read(p, len, deadline);
        if (!r) { return Error{r.errorCode()}; }
        if (*r == 0) { return Error{ENODATA}; }
        p += *r;
        len -= *r;
    }
    return {};
}

size_t BufferedReader::memoryHeld() const noexcept {
    return (own_ ? ownCap_ : 0) + lease_.capacity() + held_.capacity();
}

// ---- BufferedWriter ------------------------------------------------------------------------------

BufferedWriter::BufferedWriter(TcpStream& stream, size_t capacity) noexcept
    : stream_(stream), capacity_(std::max<size_t>(capacity, 1)) {}

Result<void> BufferedWriter::write(const void* data, size_t len, Deadline deadline, size_t* taken) noexcept {
    if (taken != nullptr) { *taken = 0; }
    if (used_ + len <= capacity_) {
        if (!buf_) {
            buf_.reset(new (std::nothrow) char[capacity_]);
            if (!buf_) { return Error{ENOMEM}; }
        }
        std::memcpy(buf_.get() + used_, data, len);
        used_ += len;
        if (taken != nullptr) { *taken = len; }
        return {};
    }
    // Does not fit: what is buffered and the new bytes leave in one gathered send.
    iovec iov[2] = {{buf_.get(), used_}, {const_cast<void*>(data), len}};
    const size_t before = used_;
    auto r = stream_.writevAll(iov, 2, deadline);
    if (!r) {
        // Keep what of the buffered bytes did not leave; of the caller's bytes, say how many left, so
        // that a retry sends only the rest.
        const size_t sentOfBuffer = before - iov[0].iov_len;
        if (sentOfBuffer > 0 && iov[0].iov_len > 0) { std::memmove(buf_.get(), buf_.get() + sentOfBuffer, iov[0].iov_len); }
        used_ = iov[0].iov_len;
        if (taken != nullptr) { *taken = len - iov[1].iov_len; }
        return r;
    }
    used_ = 0;
    if (taken != nullptr) { *taken = len; }
    return {};
}

Result<void> BufferedWriter::flush(Deadline deadline) noexcept {
    if (used_ == 0) { return {}; }
    size_t sent = 0;
    auto r = stream_.writeAll(buf_.get(), used_, deadline, &sent);
    if (sent > 0 && sent < used_) { std::memmove(buf_.get(), buf_.get() + sent, used_ - sent); }
    used_ -= sent;
    return r;
}

}  // namespace spindle::net
