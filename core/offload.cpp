// SPDX-License-Identifier: Apache-2.0
#include "core/offload.h"

#include <pthread.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "base/inject.h"
#include "base/log.h"
#include "core/internal/offload_pool.h"
#include "core/internal/runtime_impl.h"

namespace spindle::detail {

int submitOffload(RuntimeImpl* rt, OffloadItem* item) noexcept {
    if (rt->stopping()) { return ECANCELED; }
    return rt->offloadPool().submit(item);
}

size_t offloadQueued(RuntimeImpl* rt) noexcept { return rt->offloadPool().queued(); }

OffloadPool::~OffloadPool() {
    close();
    join();
}

int OffloadPool::submit(OffloadItem* item) noexcept {
    {
        std::lock_guard lock(mu_);
        // Checked under mu_: close() either sees this item in the queue or we see closed_.
        if (closed_) { return ECANCELED; }
        if (threads_.empty()) {
            startThreadsLocked();
            if (threads_.empty()) { return EAGAIN; }
        }
        item->next = nullptr;
        if (tail_ != nullptr) {
            tail_->next = item;
        } else {
            head_ = item;
        }
        tail_ = item;
        ++queued_;
    }
    cv_.notify_one();
    return 0;
}

void OffloadPool::startThreadsLocked() noexcept {
    try {
        threads_.reserve(threadCount_);
        for (unsigned i = 0; i < threadCount_; ++i) { threads_.emplace_back([this] { threadMain(); }); }
    } catch (const std::system_error& e) {
        log::warn("offload pool: started {} of {} threads: {}", threads_.size(), threadCount_, e.what());
    } catch (const std::bad_alloc&) {
        log::warn("offload pool: started {} of {} threads: out of memory", threads_.size(), threadCount_);
    }
}

void OffloadPool::close() noexcept {
    OffloadItem* head;
    {
        std::lock_guard lock(mu_);
        closed_ = true;
        head = head_;
        head_ = tail_ = nullptr;
        queued_ = 0;
    }
    cv_.notify_all();
    while (head != nullptr) {
        OffloadItem* next = head->next;  // read first: the owner may return (and its frame die) once set
        head->done.set(-ECANCELED);
        head = next;
    }
}

void OffloadPool::join() noexcept {
    std::vector<std::thread> threads;
    {
        std::lock_guard lock(mu_);
        SPINDLE_CHECK_MSG(closed_, "OffloadPool::join() before close()");
        threads.swap(threads_);
    }
    for (auto& t : threads) { t.join(); }
}

size_t OffloadPool::queued() const noexcept {
    std::lock_guard lock(mu_);
    return queued_;
}

void OffloadPool::setCpus(const cpu_set_t& cpus) noexcept {
    std::lock_guard lock(mu_);
    cpus_ = cpus;
}

void OffloadPool::threadMain() noexcept {
    ::pthread_setname_np(::pthread_self(), "spindle-off");
    std::unique_lock lock(mu_);
    const cpu_set_t cpus = cpus_;
    lock.unlock();  // a submit() need not wait while this thread moves
    if (CPU_COUNT(&cpus) > 0) {
        // The runtime checked these CPUs at start; one taken away since (a cpuset change) leaves the
        // thread where it was born, which still works.
        int err = 0;
        SPINDLE_INJECT(inject::Point::kThreadAffinity, { err = injectedErrno; });  // in place of the call
        if (err == 0) { err = ::pthread_setaffinity_np(::pthread_self(), sizeof cpus, &cpus); }
        if (err != 0) {
            log::warn("offload pool: a thread could not be placed on its CPUs: {}", std::strerror(err));
        }
    }
    lock.lock();
    for (;;) {
        cv_.wait(lock, [this] { return head_ != nullptr || closed_; });
        if (head_ == nullptr) { return; }  // closed and drained
        OffloadItem* item = head_;
        head_ = item->next;
        if (head_ == nullptr) { tail_ = nullptr; }
        --queued_;
        lock.unlock();
        item->run(item);
        item->done.set(0);  // the last touch of item: its owner may return at once
        lock.lock();
    }
}

}  // namespace spindle::detail
