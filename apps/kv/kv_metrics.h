// SPDX-License-Identifier: Apache-2.0
#pragma once
/// spindle-kv's own metric families (README.md, "Metrics"): what Server::stats() counts, the same
/// numbers INFO reports and the server prints when it stops, for the page that --metrics-port serves.

#include <cstdint>

#include "apps/kv/server.h"
#include "base/metrics_text.h"

namespace spindle::kv {

/// Writes the spindle_kv_* families of `s`. Errors: as metrics::Writer's.
inline void writeServerMetrics(metrics::Writer& w, const ServerStats& s) {
    using metrics::Type;
    w.family("spindle_kv_connections_accepted_total", Type::kCounter, "Client connections accepted.");
    w.sample({}, s.connections);
    w.family("spindle_kv_clients", Type::kGauge, "Clients connected now.");
    w.sample({}, s.clients);
    w.family("spindle_kv_rejected_clients_total", Type::kCounter, "Connections refused for --maxclients.");
    w.sample({}, s.rejectedClients);
    w.family("spindle_kv_commands_total", Type::kCounter, "Commands processed.");
    w.sample({}, s.commands);
    w.family("spindle_kv_keys", Type::kGauge, "Keys held, over every shard.");
    w.sample({}, s.keys);
    w.family("spindle_kv_used_memory_bytes", Type::kGauge, "Bytes of keys and values (what --maxmemory limits).");
    w.sample({}, s.usedMemory);
    w.family("spindle_kv_log_records_total", Type::kCounter, "Records appended to the write-ahead logs.");
    w.sample({}, s.log.records);
    w.family("spindle_kv_log_bytes_total", Type::kCounter, "Bytes written to the write-ahead logs.");
    w.sample({}, s.log.bytes);
    w.family("spindle_kv_log_fdatasyncs_total", Type::kCounter, "fdatasync calls on the logs that succeeded.");
    w.sample({}, s.log.syncs);
    w.family("spindle_kv_log_synced_records_total", Type::kCounter,
             "Records those fdatasyncs covered (divided by the fdatasyncs: the mean group-commit batch).");
    w.sample({}, s.log.syncedRecords);
    w.family("spindle_kv_replayed_records", Type::kGauge, "Records replayed from the logs at start-up.");
    w.sample({}, s.replayedRecords);
    w.family("spindle_kv_dropped_tail_bytes", Type::kGauge, "Bytes of torn or corrupt log tails dropped at start-up.");
    w.sample({}, s.droppedTailBytes);
    w.family("spindle_kv_dropped_records", Type::kGauge,
             "Valid log records after a corruption that --truncate-corrupt-log dropped at start-up.");
    w.sample({}, s.droppedRecords);
    w.family("spindle_kv_log_rewrites_total", Type::kCounter,
             "Shard log rewrites (BGREWRITEAOF, SAVE, automatic) that switched to the new log, or failed.");
    w.sample({{"result", "ok"}}, s.rewrites);
    w.sample({{"result", "failed"}}, s.rewritesFailed);
    w.family("spindle_kv_receives_total", Type::kCounter,
             "Receives that brought a connection bytes: into a buffer of the provided-buffer ring, into a heap "
             "buffer instead (the ring had run dry), or into the connection's own buffer (no provided buffers).");
    w.sample({{"buffer", "provided"}}, s.providedReceives);
    w.sample({{"buffer", "heap"}}, s.heapReceives);
    w.sample({{"buffer", "own"}}, s.ownBufferReceives);
    w.family("spindle_kv_receive_ring_exhausted_total", Type::kCounter,
             "Receives a carrier's provided-buffer ring ran dry under (ENOBUFS).");
    w.sample({}, s.receiveRingExhausted);
}

}  // namespace spindle::kv
