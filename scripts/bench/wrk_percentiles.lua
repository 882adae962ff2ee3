-- SPDX-License-Identifier: Apache-2.0
-- wrk script for scripts/bench/http.sh: after a run, prints the latency distribution wrk recorded as
-- "cdf PERCENT MICROSECONDS" lines (0 is the minimum, 100 the maximum), for --out's http-latency.csv,
-- and a "summary BYTES MICROSECONDS" line: the bytes read over the run's time, for large-file mode.
-- It defines only done(), so wrk still sends its one static request and reads no response in Lua.
local percents = { 1, 5, 10, 20, 25, 30, 40, 50, 60, 70, 75, 80, 90, 95, 97.5, 99, 99.5, 99.9, 99.99 }

done = function(summary, latency, requests)
  io.write(string.format("cdf 0 %d\n", latency.min))
  for _, p in ipairs(percents) do
    io.write(string.format("cdf %g %d\n", p, latency:percentile(p)))
  end
  io.write(string.format("cdf 100 %d\n", latency.max))
  io.write(string.format("summary %.0f %.0f\n", summary.bytes, summary.duration))
end
