// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Packet buffers (rte_mbuf) taken from and given back to their pools, with what ThreadSanitizer
/// needs to know about them.
///
/// DPDK's shared libraries are not instrumented: when an mbuf goes from one carrier to another
/// through a device's ring, or back into its pool on one carrier and out of it on another, the
/// release and acquire that order the two threads happen inside code TSan cannot see, and it reports
/// the next access as a race. In TSan builds these helpers, Port::transmit() and the port's poller
/// state the hand-over (a release on each mbuf where it leaves a thread, an acquire where it
/// arrives); elsewhere they compile to the plain DPDK calls. Code that allocates or frees packets
/// for spindle's ports should use them.
/// Errors: allocPackets() returns false, allocating nothing, when the pool has fewer than `n` free.
/// Thread-safety: as DPDK's mempool calls (any registered thread; per-lcore caches for those).

#include <rte_mbuf.h>

#if defined(SPINDLE_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

namespace spindle::dpdk {
namespace detail {

/// `m` (all its segments) leaves this thread: into a device's ring or its pool.
inline void handOver(rte_mbuf* m) noexcept {
#if defined(SPINDLE_TSAN)
    while (m != nullptr) {
        rte_mbuf* next = m->next;  // read before the release: after it the mbuf is another thread's
        __tsan_release(m);
        m = next;
    }
#else
    (void)m;
#endif
}
/// `m` arrives on this thread: from a device's ring or its pool.
inline void takeOver(rte_mbuf* m) noexcept {
#if defined(SPINDLE_TSAN)
    for (; m != nullptr; m = m->next) { __tsan_acquire(m); }
#else
    (void)m;
#endif
}

}  // namespace detail

/// `n` packets from `pool`, reset (empty, default headroom); false when it has fewer free.
[[nodiscard]] inline bool allocPackets(rte_mempool* pool, rte_mbuf** out, unsigned n) noexcept {
#if defined(SPINDLE_TSAN)
    // The reset below writes the mbufs: order it after their last user's writes on another thread.
    if (::rte_mempool_get_bulk(pool, reinterpret_cast<void**>(out), n) != 0) { return false; }
    for (unsigned i = 0; i < n; ++i) {
        __tsan_acquire(out[i]);
        ::rte_pktmbuf_reset(out[i]);
        ::rte_mbuf_refcnt_set(out[i], 1);
    }
    return true;
#else
    return ::rte_pktmbuf_alloc_bulk(pool, out, n) == 0;
#endif
}

/// Gives `n` packets (and their segments) back to their pools.
inline void freePackets(rte_mbuf** packets, unsigned n) noexcept {
    for (unsigned i = 0; i < n; ++i) { detail::handOver(packets[i]); }
    ::rte_pktmbuf_free_bulk(packets, n);
}

}  // namespace spindle::dpdk
