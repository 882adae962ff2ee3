// SPDX-License-Identifier: Apache-2.0
#include "apps/kv/key_locks.h"

namespace spindle::kv {

bool KeyLocks::blocked(std::string_view key, bool write) const {
    if (wholeExclusive_ || (write && wholeShared_ > 0)) { return true; }
    if (held_.empty()) { return false; }
    auto it = held_.find(key);
    return it != held_.end() && (it->second.exclusive || write);
}

bool KeyLocks::free(const LockRequest& req) const {
    if (wholeExclusive_) { return false; }
    if (req.wholeShard) { return req.exclusive ? held_.empty() && wholeShared_ == 0 : exclusiveKeys_ == 0; }
    if (req.exclusive && wholeShared_ > 0) { return false; }
    for (std::string_view k : req.keys) {
        auto it = held_.find(k);
        if (it == held_.end()) { continue; }
        if (it->second.exclusive || req.exclusive) { return false; }
    }
    return true;
}

void KeyLocks::take(const LockRequest& req) {
    if (req.wholeShard) {
        if (req.exclusive) {
            wholeExclusive_ = true;
        } else {
            ++wholeShared_;
        }
        return;
    }
    for (std::string_view k : req.keys) {
        auto it = held_.find(k);
        if (it == held_.end()) { it = held_.emplace(std::string(k), Hold{}).first; }
        if (req.exclusive) {
            it->second.exclusive = true;
            ++exclusiveKeys_;
        } else {
            ++it->second.shared;
        }
    }
}

void KeyLocks::release(const LockRequest& req) {
    for (std::string_view k : req.keys) {
        auto it = held_.find(k);
        if (it == held_.end()) { continue; }
        if (req.exclusive) {
            if (it->second.exclusive) { --exclusiveKeys_; }
            it->second.exclusive = false;
        } else if (it->second.shared > 0) {
            --it->second.shared;
        }
        if (!it->second.exclusive && it->second.shared == 0) { held_.erase(it); }
    }
}

bool KeyLocks::tryLock(const LockRequest& req) {
    if (!queue_.empty() || !free(req)) { return false; }
    take(req);
    return true;
}

bool KeyLocks::lockOrQueue(LockRequest& req) {
    if (tryLock(req)) { return true; }
    queue_.push_back(&req);
    return false;
}

void KeyLocks::unlock(const LockRequest& req) {
    if (!req.wholeShard) {
        release(req);
    } else if (req.exclusive) {
        wholeExclusive_ = false;
    } else if (wholeShared_ > 0) {
        --wholeShared_;
    }
    while (!queue_.empty() && free(*queue_.front())) {
        LockRequest* next = queue_.front();
        queue_.pop_front();
        take(*next);
        next->granted.set(0);  // the last touch: its coordinator may return and free it
    }
    std::vector<FiberFuture*> wake;
    wake.swap(waiters_);
    for (FiberFuture* f : wake) { f->set(0); }
}

}  // namespace spindle::kv
