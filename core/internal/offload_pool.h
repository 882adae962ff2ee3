// SPDX-License-Identifier: Apache-2.0
#pragma once
/// OffloadPool: the plain threads that run offload() work for one Runtime.
///
/// A mutex-and-condvar protected intrusive FIFO of OffloadItems (which live on
/// their callers' stacks, so a push allocates nothing), served by up to
/// `threads` threads named "spindle-off", started by the first submit().
///
/// Thread-safety: every member may be called from any thread; join() not from
/// a pool thread.
/// Shutdown: close() completes every queued item with -ECANCELED and refuses
/// new ones; the threads finish the item they run, then exit; join() waits.
/// Placement: each thread pins itself to the CPUs given to setCpus() as it
/// starts, not to those of the thread whose submit() started it (a carrier,
/// bound to one CPU: the pool would then compete with that carrier alone).

#include <sched.h>

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>
#include <vector>

#include "core/offload.h"

namespace spindle::detail {

class OffloadPool {
public:
    explicit OffloadPool(unsigned threads) noexcept : threadCount_(threads) {}
    ~OffloadPool();
    OffloadPool(const OffloadPool&) = delete;
    OffloadPool& operator=(const OffloadPool&) = delete;

    /// Queues `item`; returns 0, or ECANCELED after close(), or EAGAIN when no thread could be started.
    [[nodiscard]] int submit(OffloadItem* item) noexcept;
    /// Refuses new work and completes the queued items with -ECANCELED. Idempotent.
    void close() noexcept;
    /// Waits for the threads to exit. Precondition: close() was called.
    void join() noexcept;
    [[nodiscard]] size_t queued() const noexcept;
    /// Where the threads run: set before the first submit() (threads already started keep theirs).
    void setCpus(const cpu_set_t& cpus) noexcept;

private:
    void startThreadsLocked() noexcept;
    void threadMain() noexcept;

    const unsigned threadCount_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    // Guarded by mu_. Invariant: head_ == nullptr iff tail_ == nullptr iff queued_ == 0.
    OffloadItem* head_ = nullptr;
    OffloadItem* tail_ = nullptr;
    size_t queued_ = 0;
    bool closed_ = false;
    std::vector<std::thread> threads_;  // empty until the first submit()
    cpu_set_t cpus_{};                  // setCpus()'s; empty: threads stay where they are born (guarded by mu_)
};

}  // namespace spindle::detail
