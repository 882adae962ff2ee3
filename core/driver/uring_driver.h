// SPDX-License-Identifier: Apache-2.0
#pragma once
/// UringDriver: the I/O driver on one io_uring ring (the default backend).
///
/// Every op becomes one SQE, filled in prepare(), the one place that calls io_uring_prep_* (as
/// Seastar's prepare_sqe); its user_data is the IoRequest, whose complete() the CQE calls. An op
/// with a deadline is linked to an IORING_OP_LINK_TIMEOUT whose user_data is the same request with
/// bit 0 set, and the request completes once both CQEs have come (the kernel cancels by user_data,
/// and the request's frame may be reused right after). A parked carrier is woken by IORING_OP_MSG_RING
/// from another carrier's ring (5.18) or by an eventfd whose read is always armed on the ring.
/// Thread-safety: as Driver.

#include <cstdint>

#include "core/deadline.h"
#include "core/driver/driver.h"
#include "uring/ring.h"

namespace spindle::detail {

class UringDriver final : public Driver {
public:
    explicit UringDriver(const uring::RingOptions& options) noexcept : options_(options) {}
    ~UringDriver() override;

    [[nodiscard]] Backend backend() const noexcept override { return Backend::kUring; }
    [[nodiscard]] Result<void> init(Carrier* owner) noexcept override;
    void close() noexcept override;

    /// Inline, so that a carrier that knows its driver is this one (Carrier::startIo) pays no call for
    /// the common case: one SQE, no deadline.
    int32_t start(op::IoRequest* req) noexcept override {
        if (req->deadlineNs != 0) [[unlikely]] { return startLinked(req); }
        io_uring_sqe* sqe = ring_.acquireSqe();
        prepare(sqe, *req->op);
        io_uring_sqe_set_data64(sqe, userData(req));
        ++inflight_;
        return kPending;
    }
    void cancel(op::IoRequest* req) noexcept override;
    void cancelAll() noexcept override;

    void poll(bool getEvents) noexcept override;
    [[nodiscard]] bool hasWork() const noexcept override {
        return ring_.pending() != 0 || ring_.cqReady() != 0 || ring_.needsEnter();
    }
    void wait(int64_t timeoutNs) noexcept override;
    void reap() noexcept override {
        ring_.reap([this](const io_uring_cqe* cqe) { dispatch(cqe); });
    }
    [[nodiscard]] bool parkCollects() const noexcept override {
        return ring_.features().deferTaskrun && ring_.pending() == 0 && !ring_.needsEnter();
    }
    [[nodiscard]] uint64_t nextDeadline() const noexcept override { return UINT64_MAX; }

    void wakeFrom(Carrier* from) noexcept override;
    [[nodiscard]] uint32_t inflight() const noexcept override { return inflight_ - (eventFdArmed_ ? 1 : 0); }
    void drainForExit() noexcept override;

    [[nodiscard]] uring::Ring* ring() noexcept override { return &ring_; }
    [[nodiscard]] std::string describe() const override;
    [[nodiscard]] Counters counters() const noexcept override;

    /// Fills `sqe` for `op` (the one translation from op::Op to io_uring). Also used by a plain
    /// thread's private ring (core/io.cpp).
    static void prepare(io_uring_sqe* sqe, const op::Op& op) noexcept;
    /// Runs `op` synchronously on the calling plain thread's private ring (made on first use, 8
    /// entries) and returns its result, or kPending when this thread can have no ring (the set-up
    /// errno is kept, and the caller falls back to the system calls). `cqeFlags` gets the CQE's flags.
    static int32_t runOnThreadRing(const op::Op& op, Deadline deadline, uint32_t* cqeFlags) noexcept;

private:
    // user_data is the request's address (8-byte aligned) with three low bits: kTimeoutBit for its
    // linked timeout, kQuietBit for a request no injected fault may touch (a multishot operation, the
    // eventfd read; both lie in uring::kNoFaultMask), kLinkedBit for an op that has a linked timeout
    // (so the common CQE is told apart without reading the request). 0 is a CQE nobody waits for (a
    // cancel). kWakeTag (both low bits, which no request's user_data has) marks a MSG_RING wake-up
    // on the sender's ring, with the target driver's address: only a failed one posts a CQE there
    // (IOSQE_CQE_SKIP_SUCCESS), and dispatch() then wakes the target through its eventfd instead.
    static constexpr uint64_t kTimeoutBit = 1;
    static constexpr uint64_t kQuietBit = 2;
    static constexpr uint64_t kLinkedBit = 4;
    static constexpr uint64_t kBits = 7;
    static constexpr uint64_t kWakeTag = kTimeoutBit | kQuietBit;
    static_assert((kTimeoutBit | kQuietBit) == uring::kNoFaultMask);
    static bool isMultishot(op::Code c) noexcept {
        return c == op::Code::kAcceptMultishot || c == op::Code::kRecvMultishot;
    }

    // start() for a request with a deadline: the op and its linked timeout (for a splice or tee, a
    // timeout of its own: startTimed).
    int32_t startLinked(op::IoRequest* req) noexcept;
    // The kernel (6.18, measured) never fires a linked timeout on a splice or tee that blocks in an
    // io_uring worker: theirs is an IORING_OP_TIMEOUT of its own. Fired first, it cancels the op (a
    // cancel does end the blocked call); the op ending first removes it. That cancel or removal (the
    // control SQE, user_data kControlBits) is awaited too: the request completes only once every CQE
    // that names it came, so no SQE can name its address after its frame is reused.
    int32_t startTimed(op::IoRequest* req) noexcept;
    enum class TimedCqe { kOp, kTimer, kControl };
    void onTimedCqe(op::IoRequest* req, TimedCqe which, int32_t res) noexcept;
    static constexpr uint64_t kControlBits = kTimeoutBit | kLinkedBit;  // no other user_data has both
    static constexpr uint32_t kOwnTimer = 0x100;   // driverState: started by startTimed
    static constexpr uint32_t kOpDue = 0x1;        // ... the op's CQE is still to come
    static constexpr uint32_t kTimerDue = 0x2;     // ... the timeout's
    static constexpr uint32_t kControlDue = 0x4;   // ... the control SQE's
    static constexpr uint32_t kControlSent = 0x8;  // ... which went (there is one at most)
    void dispatch(const io_uring_cqe* cqe) noexcept;
    [[nodiscard]] uint64_t userData(const op::IoRequest* req) const noexcept {
        uint64_t ud = reinterpret_cast<uint64_t>(req);
        if (isMultishot(req->op->code) || req == &eventRead_) [[unlikely]] { ud |= kQuietBit; }
        if (req->deadlineNs != 0) { ud |= kLinkedBit; }
        return ud;
    }
    static void onOverflowReap(void* self, const io_uring_cqe* cqe);
    void armEventFd() noexcept;
    static void onEventFd(op::IoRequest* req, int32_t res, uint32_t flags) noexcept;
    // Sends a MSG_RING wake-up to `target`'s ring from this one; a failure falls back to wakeByEventFd().
    void sendWake(UringDriver& target) noexcept;
    // Wakes this driver's carrier through the eventfd its ring always reads (any thread).
    void wakeByEventFd() noexcept;

    uring::RingOptions options_;
    uring::Ring ring_;
    Carrier* owner_ = nullptr;
    uint32_t inflight_ = 0;      // CQEs we still expect for started requests (timeouts and the eventfd read included)
    int eventFd_ = -1;
    uint64_t eventBuf_ = 0;
    op::Op eventOp_;
    struct EventRead : op::IoRequest {
        UringDriver* driver = nullptr;
    };
    EventRead eventRead_;        // the always-armed eventfd read, a plain thread's way in
    bool eventFdArmed_ = false;
    bool exiting_ = false;       // drainForExit began: the eventfd read is not re-armed
    bool wakeFailureLogged_ = false;
};

}  // namespace spindle::detail
