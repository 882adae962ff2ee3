// SPDX-License-Identifier: Apache-2.0
#pragma once
/// EpollDriver: the I/O driver where io_uring cannot be used (a seccomp filter, a disabled sysctl,
/// qemu-user), on one epoll set per carrier.
///
/// Sockets, pipes and other pollable descriptors: an operation is tried at once without blocking
/// (MSG_DONTWAIT, RWF_NOWAIT); only on EAGAIN does its request wait, in the descriptor's waiter list,
/// for readiness. A descriptor joins this carrier's epoll set edge-triggered on its first EAGAIN and
/// stays there until spindle::close() (or the kernel's own removal when the file is released); an
/// event retries the waiters in the carrier's loop and completes those that got an answer. For a
/// stream socket, a receive that came back short marks it drained, so the next receive waits for an
/// event instead of costing a system call that would answer EAGAIN.
/// A splice or tee between pipes and sockets is tried the same way (SPLICE_F_NONBLOCK, its sockets made
/// O_NONBLOCK) and waits in the list of the end it lacks: the input's for bytes, else the output's for
/// room (kOnOutput); each retry picks the end again. One with another end (a regular file, a device)
/// goes to the pool.
/// Regular files (which epoll refuses with EPERM) and the path operations (openat, statx, fsync, ...)
/// are answered kBlocking: submitAndWait runs them on the offload pool; a read or write is first tried
/// with RWF_NOWAIT, which the page cache often answers at once.
/// Multishot accept is emulated (each accepted connection completes with op::kMore). So are
/// provided-buffer receives (op::kBufferSelect): the buffer comes from a BufferGroup registered here
/// (registerBufferGroup) at the moment the socket has data, and a multishot receive stays in the
/// descriptor's waiter list for good, delivering one buffer per receive from the loop (op::kMore)
/// until end of stream, an error, a cancel, or no free buffer (ENOBUFS ends it, as on io_uring).
/// Deadlines sit in a heap of their own; park() sleeps until the nearest one.
/// Wake-ups: an eventfd in the set, written from any thread.
///
/// A descriptor's registration is re-armed (EPOLL_CTL_MOD) when a request starts waiting on it, which
/// makes a number closed with close(2) and reused safe (MOD then answers ENOENT and the new file is
/// added) and reports a file that became ready meanwhile at once; the MOD is skipped when an event
/// came for the registration in the batch this carrier is still running (the receive that an event
/// answered, then a send, then the next receive: an echo's or a request's round), since the event
/// proves the registration is the open file's. What that leaves: a number closed with close(2) and
/// reused within that same batch by another fiber of the carrier; spindle's own sockets bump the
/// number's close generation when they close and when accept returns them, which forgets the proof.
/// Accept and connect set O_NONBLOCK on their socket (checked on each call).
/// Thread-safety: as Driver.

#include <sys/epoll.h>

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/deadline.h"
#include "core/driver/driver.h"

namespace spindle::detail {

class RuntimeImpl;

/// start()'s answer for an op that must run as a blocking call off the carrier (the offload pool).
inline constexpr int32_t kBlocking = INT32_MIN + 1;

class EpollDriver final : public Driver {
public:
    explicit EpollDriver(RuntimeImpl* runtime) noexcept : runtime_(runtime) {}
    ~EpollDriver() override;

    [[nodiscard]] Backend backend() const noexcept override { return Backend::kEpoll; }
    [[nodiscard]] Result<void> init(Carrier* owner) noexcept override;
    void close() noexcept override;

    int32_t start(op::IoRequest* req) noexcept override;
    void cancel(op::IoRequest* req) noexcept override;
    void cancelAll() noexcept override;

    void poll(bool getEvents) noexcept override;
    [[nodiscard]] bool hasWork() const noexcept override { return false; }
    void wait(int64_t timeoutNs) noexcept override;
    void reap() noexcept override;
    [[nodiscard]] bool parkCollects() const noexcept override { return true; }
    [[nodiscard]] uint64_t nextDeadline() const noexcept override;

    void wakeFrom(Carrier* from) noexcept override;
    [[nodiscard]] uint32_t inflight() const noexcept override { return waiting_; }
    void drainForExit() noexcept override;
    [[nodiscard]] std::string describe() const override;
    [[nodiscard]] Counters counters() const noexcept override;
    [[nodiscard]] Result<void> registerBufferGroup(uint16_t id, BufferGroup* group) noexcept override;
    [[nodiscard]] Result<void> unregisterBufferGroup(uint16_t id) noexcept override;

    /// Runs `op` to completion on the calling thread with blocking system calls (waiting in poll(2)
    /// for a descriptor that answers EAGAIN), honouring `deadline` (-ETIMEDOUT) for pollable
    /// descriptors. Used off-fiber, and for kBlocking ops on the offload pool.
    static int32_t performBlocking(const op::Op& op, Deadline deadline) noexcept;
    /// Runs a kBlocking op (a file or path operation) with the plain blocking call; on the pool.
    static int32_t runBlocking(const op::Op& op) noexcept;

private:
    // What this carrier knows of one descriptor; indexed by fd.
    struct FdState {
        op::IoRequest* head = nullptr;  // waiters, oldest first
        op::IoRequest* tail = nullptr;
        uint32_t gen = 0;               // closeGeneration(fd) when this state was made
        bool known = false;             // the fields below are valid for generation `gen`
        bool registered = false;        // in this carrier's epoll set
        bool regular = false;           // epoll refused it (EPERM): a regular file or directory
        bool stream = false;            // a stream socket: a short receive means drained
        bool plainRw = false;           // no RWF_NOWAIT here (EOPNOTSUPP): O_NONBLOCK and plain reads
        bool readReady = true;          // no EAGAIN on input since the last input event
        bool readEnded = false;         // the peer shut its side (RDHUP/HUP/ERR seen): a read never waits
                                        // again, so a short one does not mean drained
        // An event proved this registration live (the file behind the number is the one registered)
        // in epoch `provenEpoch`, and completed a request of fiber `provenFor` (0: none). A wait by
        // that fiber in the same epoch needs no re-arming; see registerFd.
        uint64_t provenEpoch = 0;
        uint64_t provenFor = 0;
        bool writeReady = true;
    };

    int32_t startOp(op::IoRequest* req) noexcept;
    // One non-blocking attempt at `o` on the descriptor `st` describes.
    int32_t tryOnce(const op::Op& o, FdState& st) noexcept;
    FdState* stateFor(int fd) noexcept;
    // Adds fd to the epoll set if it is not there; -errno (EPERM: not pollable) on failure.
    // `drained`: the caller just found the descriptor not ready (EAGAIN, or a short stream read since the
    // last event), so any readiness from now on comes as a new edge and a proven registration needs no
    // re-arming; otherwise the MOD is what reports readiness that is there already.
    int32_t registerFd(int fd, FdState& st, bool drained = false) noexcept;
    // The id of the fiber running on this carrier; 0 outside a fiber.
    [[nodiscard]] uint64_t runningFiberId() const noexcept;
    // Puts `req` in the waiter list of `st`: o.fd's, or o.fd2's waiting for room (`onOutput`:
    // kOnOutput, a splice's or tee's output end). kPending, or -errno when it cannot wait there.
    int32_t park(op::IoRequest* req, FdState& st, bool drained, uint32_t onOutput = 0) noexcept;
    // A splice or tee between pipes or sockets that answered EAGAIN: parks it on the end it waits
    // for, or returns its result when a retry answered at once. `backoff`: how many waits out of a
    // lasting EAGAIN came just before (parkRetry's doubling).
    int32_t parkSplice(op::IoRequest* req, uint32_t backoff = 0) noexcept;
    // A splice or tee whose EAGAIN lasts though both ends poll ready (TCP's global memory limit):
    // waits on the deadline heap alone for 1 ms << backoff (at most 64 ms; never past its deadline),
    // in no descriptor's list, since readiness that is there already would retry it at once, without
    // end. kPending.
    int32_t parkRetry(op::IoRequest* req, uint32_t backoff) noexcept;
    // Tries a parked splice or tee again, out of its list and off the heap (unlink()): finishes it, or
    // parks it again (parkSplice with `backoff`).
    void retrySplice(op::IoRequest* req, uint32_t backoff) noexcept;
    // After a read of `got` bytes out of `asked` from a registered stream socket: a short one means
    // nothing more until the next event (unless the peer shut its side, when the next read answers end
    // of stream at once; that event may have been the same edge).
    static void noteRead(FdState& st, int32_t got, size_t asked) noexcept {
        if (got > 0 && static_cast<size_t>(got) < asked && st.stream && st.registered && !st.readEnded) {
            st.readReady = false;
        }
    }
    // Completes `req`, a multishot op that stays armed, with one result; false when its completion
    // handler ended it (a cancel from inside the handler: the request may be gone).
    [[nodiscard]] bool deliverOne(op::IoRequest* req, int32_t res, uint32_t flags) noexcept;
    // One non-blocking receive into a buffer of group o.bufIndex; on success `flags` names it.
    int32_t recvSelected(const op::Op& o, FdState& st, uint32_t* flags) noexcept;
    // A multishot receive's deliveries for one event: until EAGAIN, a short read, or the op's end.
    void deliverRecvs(op::IoRequest* req, FdState& st) noexcept;
    [[nodiscard]] BufferGroup* group(uint16_t id) const noexcept;
    void unlink(op::IoRequest* req) noexcept;
    void finish(op::IoRequest* req, int32_t res, uint32_t flags) noexcept;
    void handleEvents(int count) noexcept;
    // Prefetches, for the events after event `i` of `count`, what handling them will load.
    void prefetchAhead(int i, int count) const noexcept;
    void retryWaiters(int fd, uint32_t events) noexcept;
    void expireDeadlines() noexcept;
    // A request's key in the deadline heap: its deadline, or a retry's time (parkRetry).
    [[nodiscard]] static uint64_t wakeAt(const op::IoRequest* req) noexcept;
    void heapPush(op::IoRequest* req) noexcept;
    void heapRemove(op::IoRequest* req) noexcept;
    void heapSiftUp(size_t i) noexcept;
    void heapSiftDown(size_t i) noexcept;

    static constexpr int kMaxEvents = 128;

    RuntimeImpl* runtime_;
    Carrier* owner_ = nullptr;
    int epfd_ = -1;
    int wakeFd_ = -1;
    uint32_t waiting_ = 0;             // requests parked: in fd lists, or on the heap alone (parkRetry)
    int pendingEvents_ = 0;            // events wait() collected for reap()
    uint64_t epoch_ = 1;               // one more each time the carrier looks for events (poll, wait)
    std::vector<FdState> fds_;
    std::atomic<uint32_t>* gens_ = nullptr;  // the process's close generations (see bumpCloseGeneration)
    size_t gensSize_ = 0;
    std::vector<op::IoRequest*> deadlines_;  // a binary min-heap on wakeAt(); req->heapIndex = slot + 1
    std::vector<std::pair<uint16_t, BufferGroup*>> groups_;  // registered buffer groups (a handful)
    // The multishot request deliverOne() is completing, and whether its handler ended it.
    op::IoRequest* delivering_ = nullptr;
    bool deliveringEnded_ = false;
    // Owner-written, read racily by Runtime::stats().
    std::atomic<uint64_t> enters_{0};
    std::atomic<uint64_t> started_{0};
    std::atomic<uint64_t> completed_{0};
    epoll_event events_[kMaxEvents];
};

/// Bumped by spindle::close() on the epoll backend, so every carrier sees its FdState for that
/// number as stale (any thread; relaxed).
void bumpCloseGeneration(int fd) noexcept;

}  // namespace spindle::detail
