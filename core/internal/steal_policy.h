// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The steal policy (RuntimeOptions::stealPolicy), written once: which of its victims a thief looks at,
/// in what order, and whether it may take from one. Carrier::trySteal (the thief), Carrier::canStealAny
/// (the parker's last look) and Carrier::mayStealFrom (what a waker asks) all go through it.
///
/// Thread-safety: pure functions of their arguments; the victims' queue lengths they are given are
/// racy snapshots, so an answer is a hint, as stealing itself is.

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/runtime.h"
#include "numa/topology.h"

namespace spindle::detail {

class Carrier;

/// A carrier to steal from, and how far it is from the thief (numa::Distance from logical PUs).
struct StealVictim {
    Carrier* carrier = nullptr;
    numa::Distance distance = numa::Distance::kRemotePackage;
};

/// Whether `policy` lets a thief take from a victim with `queued` runnable fibers; `crossesNode`: the
/// victim is on another NUMA node than the thief. kNuma crosses only for a backlog of more than
/// `crossNodeThreshold`, so that a fiber leaves its node (and its stack's memory) only when it would
/// otherwise wait.
[[nodiscard]] constexpr bool stealAllowed(StealPolicy policy, bool crossesNode, size_t queued,
                                          unsigned crossNodeThreshold) noexcept {
    switch (policy) {
        case StealPolicy::kNone: return false;
        case StealPolicy::kRandom: return queued > 0;
        case StealPolicy::kLocalOnly: return !crossesNode && queued > 0;
        case StealPolicy::kNuma: return queued > (crossesNode ? size_t{crossNodeThreshold} : 0);
    }
    return false;
}

/// One pass of a thief over `victims` (sorted nearest first, the first `localCount` on its own node):
/// visits, in the order `policy` tries them, each victim that stealAllowed() accepts given queued(victim),
/// and stops at the first for which take(victim) returns true. Returns whether one did. No allocation;
/// each victim is looked at once at most. kRandom starts at random() % size (random is called only then);
/// the others start at the nearest, and kLocalOnly stops at the node's edge, so the victims beyond it are
/// never read. The victims being sorted, kNuma reaches another node only once every victim on its own
/// was refused or came up empty.
template <class Queued, class Random, class Take>
bool stealPass(StealPolicy policy, unsigned crossNodeThreshold, std::span<const StealVictim> victims,
               size_t localCount, Queued&& queued, Random&& random, Take&& take) {
    const size_t n = victims.size();
    size_t i = 0;
    size_t count = n;
    switch (policy) {
        case StealPolicy::kNone: return false;
        case StealPolicy::kRandom:
            if (n == 0) { return false; }
            i = static_cast<size_t>(random() % n);
            break;
        case StealPolicy::kLocalOnly: count = localCount; break;
        case StealPolicy::kNuma: break;
    }
    for (; count > 0; --count) {
        const StealVictim& v = victims[i];
        if (++i == n) { i = 0; }
        if (stealAllowed(policy, numa::crossesNode(v.distance), queued(v), crossNodeThreshold) && take(v)) {
            return true;
        }
    }
    return false;
}

}  // namespace spindle::detail
