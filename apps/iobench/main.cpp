// SPDX-License-Identifier: Apache-2.0
// spindle-iobench: a fio-like file I/O benchmark on spindle fibers.
//
// Each carrier runs `--depth` pinned fibers; each fiber loops: pick an offset (random and
// bs-aligned from its own PRNG, or the next block of its carrier's sequential cursor), issue one
// blocking spindle::read/write (or read_fixed/write_fixed on a registered buffer), time it. So the
// queue depth is per carrier: --carriers 2 --depth 16 keeps up to 32 I/Os in flight, as fio's
// --numjobs=2 --iodepth=16 does (fio's iodepth is per job, spindle's depth per carrier).
//
// Only I/Os that complete inside [ramp end, ramp end + duration] are counted; the window is fixed,
// so IOPS = counted / duration. Latency is submit-to-return as the fiber sees it (fio's clat plus
// its slat: the time from the call until the fiber runs again), recorded per carrier into a
// log-linear histogram (base/histogram.h) and merged at the end.
//
// --backend epoll measures the epoll backend, where file I/O runs as plain blocking calls on the
// offload pool (core/offload.h): what is in flight is then bounded by the pool's threads.
//
// Exit status: 0 done; 1 an I/O or set-up error (the message names the call and errno); 2 a bad
// flag value.

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/common/backend_flag.h"
#include "apps/common/cli.h"
#include "base/histogram.h"
#include "core/fixed.h"
#include "core/io.h"
#include "core/runtime.h"

namespace {

using Clock = std::chrono::steady_clock;  // CLOCK_MONOTONIC

constexpr int kExitIoError = spindle::apps::kExitFailure;
using spindle::apps::kExitUsage;

enum class Rw { kRandRead, kRandWrite, kRead, kWrite };

struct Options {
    std::string file;
    std::string rwName = "randread";
    std::string bsText = "4k";
    std::string sizeText;
    unsigned depth = 1;
    unsigned carriers = 1;
    double duration = 10;
    double ramp = 0;
    bool direct = false;
    bool fixedBuffers = false;
    bool json = false;
    bool noBind = false;
    std::string pollMode = "block";
    std::string backend = "auto";
    std::string workerCpus;  // --worker-cpus, as given
    bool noDeferTaskrun = false;
    uint64_t seed = 0x5eed;

    Rw rw = Rw::kRandRead;
    uint64_t bs = 4096;
    uint64_t size = 0;  // 0: the file's size
};

bool isRead(Rw rw) { return rw == Rw::kRandRead || rw == Rw::kRead; }
bool isRandom(Rw rw) { return rw == Rw::kRandRead || rw == Rw::kRandWrite; }

// Parses "4096", "4k", "4K", "4kb", "4KiB", "1m", "2g", "1t" as fio does (powers of 1024).
std::optional<uint64_t> parseSize(const std::string& text) {
    size_t i = 0;
    uint64_t value = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
        const uint64_t digit = static_cast<uint64_t>(text[i] - '0');
        if (value > (UINT64_MAX - digit) / 10) { return std::nullopt; }
        value = value * 10 + digit;
        ++i;
    }
    if (i == 0) { return std::nullopt; }
    std::string suffix = text.substr(i);
    for (char& ch : suffix) { ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch))); }
    unsigned shift = 0;
    if (!suffix.empty()) {
        switch (suffix[0]) {
            case 'k': shift = 10; break;
            case 'm': shift = 20; break;
            case 'g': shift = 30; break;
            case 't': shift = 40; break;
            case 'b': shift = 0; break;
            default: return std::nullopt;
        }
        const std::string rest = suffix.substr(1);
        if (suffix[0] == 'b' ? !rest.empty() : !(rest.empty() || rest == "b" || rest == "ib")) { return std::nullopt; }
    }
    if (shift > 0 && value > (UINT64_MAX >> shift)) { return std::nullopt; }
    return value << shift;
}

// Checks a size flag: parseSize's spelling, `min` to `max` bytes, which --help shows as "SIZE in [shown]".
CLI::Validator sizeRange(uint64_t min, uint64_t max, const std::string& shown) {
    return CLI::Validator(
        [min, max, shown](std::string& text) {
            const auto size = parseSize(text);
            if (!size || *size < min || *size > max) {
                return fmt::format("Value {} is not a size in [{}] (bytes, or with k, m, g or t as in fio)", text,
                                   shown);
            }
            return std::string();
        },
        "SIZE in [" + shown + "]");
}

std::string humanBytes(uint64_t b) {
    if (b >= (uint64_t{1} << 30)) { return fmt::format("{:.2f} GiB", static_cast<double>(b) / (1 << 30)); }
    if (b >= (uint64_t{1} << 20)) { return fmt::format("{:.2f} MiB", static_cast<double>(b) / (1 << 20)); }
    if (b >= 1024) { return fmt::format("{:.2f} KiB", static_cast<double>(b) / 1024); }
    return fmt::format("{} bytes", b);
}

int64_t nowNs() noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// splitmix64: one add and three multiply-xorshift steps; each fiber owns one, so no locks.
struct SplitMix64 {
    uint64_t state;
    uint64_t next() noexcept {
        uint64_t z = (state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    // Uniform in [0, n) by multiply-shift (Lemire), without a division.
    uint64_t below(uint64_t n) noexcept {
        return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
    }
};

// What a fiber saw go wrong first; reported by main.
struct IoError {
    int err = 0;             // errno; 0 with `got` set: a short transfer
    const char* what = "";   // the call
    uint64_t offset = 0;
    size_t got = 0;
};

// Everything one carrier's fibers share. They are pinned to that carrier, which runs one fiber at
// a time, so no field needs an atomic.
struct alignas(64) CarrierState {
    spindle::LogLinearHistogram latency;  // ns, I/Os completed inside the window
    uint64_t ios = 0;                     // I/Os completed inside the window
    uint64_t allIos = 0;                  // every I/O, ramp and overrun included
    uint64_t seqCursor = 0;               // next sequential offset
    int fd = -1;                          // this carrier's own open file description, as fio's jobs have
    IoError error;
};

struct Shared {
    Options o;
    uint64_t blocks = 0;  // o.size / o.bs
    int64_t rampEndNs = 0;
    int64_t endNs = 0;
    std::atomic<bool> stop{false};
    std::atomic<bool> failed{false};
};

uint64_t nextOffset(Shared& sh, CarrierState& cs, SplitMix64& rng) noexcept {
    if (isRandom(sh.o.rw)) { return rng.below(sh.blocks) * sh.o.bs; }
    const uint64_t off = cs.seqCursor;
    cs.seqCursor += sh.o.bs;
    if (cs.seqCursor >= sh.blocks * sh.o.bs) { cs.seqCursor = 0; }
    return off;
}

void fail(Shared& sh, CarrierState& cs, IoError e) noexcept {
    if (cs.error.what[0] == '\0') { cs.error = e; }
    sh.failed.store(true, std::memory_order_relaxed);
    sh.stop.store(true, std::memory_order_relaxed);
}

// The loop every fiber runs. `io(offset)` issues one I/O and returns its Result<size_t>.
template <class Io>
void ioLoop(Shared& sh, CarrierState& cs, SplitMix64 rng, Io&& io) noexcept {
    const size_t bs = sh.o.bs;
    const char* what = isRead(sh.o.rw) ? "read" : "write";
    while (!sh.stop.load(std::memory_order_relaxed)) {
        const uint64_t off = nextOffset(sh, cs, rng);
        const int64_t t0 = nowNs();
        spindle::Result<size_t> r = io(off);
        const int64_t t1 = nowNs();
        if (!r) {
            fail(sh, cs, IoError{r.errorCode(), what, off, 0});
            return;
        }
        if (*r != bs) {
            fail(sh, cs, IoError{0, what, off, *r});
            return;
        }
        ++cs.allIos;
        if (t1 >= sh.rampEndNs && t1 <= sh.endNs) {
            cs.latency.record(static_cast<uint64_t>(t1 - t0));
            ++cs.ios;
        }
        if (t1 >= sh.endNs) {
            sh.stop.store(true, std::memory_order_relaxed);
            return;
        }
    }
}

void fillPattern(char* p, size_t n, uint64_t seed) {
    SplitMix64 rng{seed};
    for (size_t i = 0; i < n; i += 8) {
        const uint64_t v = rng.next();
        std::memcpy(p + i, &v, std::min<size_t>(8, n - i));
    }
}

// One fiber with its own aligned buffer (O_DIRECT needs the alignment; page alignment covers it).
void plainFiber(Shared& sh, CarrierState& cs, SplitMix64 rng) noexcept {
    const size_t bytes = (sh.o.bs + 4095) / 4096 * 4096;
    std::unique_ptr<char, decltype(&std::free)> buf(static_cast<char*>(std::aligned_alloc(4096, bytes)), &std::free);
    if (!buf) {
        fail(sh, cs, IoError{ENOMEM, "aligned_alloc", 0, 0});
        return;
    }
    fillPattern(buf.get(), bytes, rng.next());
    const int fd = cs.fd;
    const size_t bs = sh.o.bs;
    char* p = buf.get();
    if (isRead(sh.o.rw)) {
        ioLoop(sh, cs, rng, [&](uint64_t off) { return spindle::read(fd, p, bs, off); });
    } else {
        ioLoop(sh, cs, rng, [&](uint64_t off) { return spindle::write(fd, p, bs, off); });
    }
}

// One fiber with a buffer from its carrier's registered pool (core/fixed.h).
void fixedFiber(Shared& sh, CarrierState& cs, SplitMix64 rng) noexcept {
    auto fb = spindle::acquireFixedBuffer();
    if (!fb) {
        fail(sh, cs, IoError{fb.errorCode(), "acquireFixedBuffer", 0, 0});
        return;
    }
    spindle::FixedBuffer buf = std::move(*fb);
    fillPattern(buf.data(), buf.size(), rng.next());
    const int fd = cs.fd;
    const size_t bs = sh.o.bs;
    if (isRead(sh.o.rw)) {
        ioLoop(sh, cs, rng, [&](uint64_t off) { return spindle::read_fixed(fd, buf, 0, bs, off); });
    } else {
        ioLoop(sh, cs, rng, [&](uint64_t off) { return spindle::write_fixed(fd, buf, 0, bs, off); });
    }
}

// Creates the file or extends it to `want` bytes with pseudo-random data (written, not a hole, so
// reads hit real blocks), like fio's lay-out step. Returns the usable size, or an errno.
spindle::Result<uint64_t> prepareFile(const Options& o) {
    const int fd = ::open(o.file.c_str(), O_RDWR | O_CLOEXEC | (o.size > 0 ? O_CREAT : 0), 0644);
    if (fd < 0) {
        const int err = errno;
        fmt::print(stderr, "spindle-iobench: open {}: {}\n", o.file, std::strerror(err));
        return spindle::Error{err};
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        const int err = errno;
        ::close(fd);
        fmt::print(stderr, "spindle-iobench: fstat {}: {}\n", o.file, std::strerror(err));
        return spindle::Error{err};
    }
    uint64_t have = static_cast<uint64_t>(st.st_size);
    if (S_ISBLK(st.st_mode)) {
        if (::ioctl(fd, BLKGETSIZE64, &have) != 0) {
            const int err = errno;
            ::close(fd);
            fmt::print(stderr, "spindle-iobench: BLKGETSIZE64 {}: {}\n", o.file, std::strerror(err));
            return spindle::Error{err};
        }
    } else if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        fmt::print(stderr, "spindle-iobench: {} is neither a regular file nor a block device\n", o.file);
        return spindle::Error{EINVAL};
    }
    if (o.size > have && S_ISREG(st.st_mode)) {
        constexpr size_t kChunk = 1 << 20;
        std::vector<char> chunk(kChunk);
        fillPattern(chunk.data(), chunk.size(), 0xf111);
        fmt::print(stderr, "spindle-iobench: laying out {} ({} more)\n", o.file, humanBytes(o.size - have));
        for (uint64_t off = have; off < o.size;) {
            const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, o.size - off));
            const ssize_t w = ::pwrite(fd, chunk.data(), n, static_cast<off_t>(off));
            if (w <= 0) {
                const int err = w < 0 ? errno : EIO;
                ::close(fd);
                fmt::print(stderr, "spindle-iobench: write {} at {}: {}\n", o.file, off, std::strerror(err));
                return spindle::Error{err};
            }
            off += static_cast<uint64_t>(w);
        }
        if (::fsync(fd) != 0) {
            const int err = errno;
            ::close(fd);
            fmt::print(stderr, "spindle-iobench: fsync {}: {}\n", o.file, std::strerror(err));
            return spindle::Error{err};
        }
        have = o.size;
    }
    ::close(fd);
    return o.size > 0 ? std::min(o.size, have) : have;
}

struct Window {
    std::vector<spindle::CarrierStats> atStart, atEnd;
};

std::string latencyField(const char* name, uint64_t ns) {
    return fmt::format("{} {:.2f}", name, static_cast<double>(ns) / 1000.0);
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    CLI::App app{"spindle-iobench: fio-like file I/O on spindle fibers (depth = fibers in flight per carrier)"};
    app.add_option("--file", o.file, "file or block device to read or write")->required();
    app.add_option("--rw", o.rwName, "randread, randwrite, read or write (default randread)")
        ->check(CLI::IsMember({"randread", "randwrite", "read", "write"}));
    app.add_option("--bs", o.bsText, "block size, with k/m/g suffixes as in fio (default 4k)")
        ->check(sizeRange(1, uint64_t{64} << 20, "1 - 64m"));
    app.add_option("--depth", o.depth, "I/Os in flight per carrier: one fiber each (default 1)")
        ->check(CLI::Range(1u, 4096u));
    app.add_option("--carriers", o.carriers, "carriers (threads), bound to the CPUs of the process cpuset (default 1)")
        ->check(CLI::Range(1u, spindle::kMaxCarriers));
    app.add_option("--duration", o.duration, "measured seconds, after the ramp (default 10)")
        ->check(spindle::apps::realRange(0.001, 86400.0));
    app.add_option("--ramp", o.ramp, "warm-up seconds whose I/Os are not counted (default 0)")
        ->check(spindle::apps::realRange(0.0, 86400.0));
    // At most the largest file offset (off_t).
    app.add_option("--size", o.sizeText,
                   "bytes of the file to use; the file is created or extended with data to this size if shorter "
                   "(default: the whole existing file)")
        ->check(sizeRange(1, uint64_t{INT64_MAX}, "1 - 2^63-1"));
    app.add_flag("--direct", o.direct, "open with O_DIRECT (bypass the page cache)");
    app.add_flag("--fixed-buffers", o.fixedBuffers,
                 "use registered buffers (acquireFixedBuffer, read_fixed/write_fixed from core/fixed.h)");
    app.add_option("--poll-mode", o.pollMode, "idle carriers: block (default), spin, or hybrid (spin 50 us, then block)")
        ->check(CLI::IsMember({"block", "spin", "hybrid"}));
    spindle::apps::addBackendFlag(app, o.backend);
    spindle::apps::addWorkerCpusFlag(app, o.workerCpus);
    app.add_flag("--no-defer-taskrun", o.noDeferTaskrun,
                 "rings without IORING_SETUP_DEFER_TASKRUN (completions posted as they come, COOP_TASKRUN)");
    app.add_flag("--no-bind", o.noBind,
                 "leave the carrier threads unbound (the scheduler may move them within the process cpuset)");
    app.add_option("--seed", o.seed, "seed of the fibers' offset generators")
        ->check(CLI::Range(uint64_t{0}, UINT64_MAX));
    app.add_flag("--json", o.json, "print one JSON object instead of the text report");
    if (auto status = spindle::apps::parseCommandLine(app, argc, argv)) { return *status; }

    auto usage = [](const std::string& msg) {
        fmt::print(stderr, "spindle-iobench: {}\n", msg);
        return kExitUsage;
    };
    o.rw = o.rwName == "randread" ? Rw::kRandRead : o.rwName == "randwrite" ? Rw::kRandWrite
         : o.rwName == "read"     ? Rw::kRead
                                  : Rw::kWrite;
    o.bs = *parseSize(o.bsText);  // the flags' checks have read both
    if (!o.sizeText.empty()) { o.size = *parseSize(o.sizeText); }
    if (o.direct && o.bs % 512 != 0) {
        return usage(fmt::format("--direct needs --bs to be a multiple of 512 (got {})", o.bs));
    }

    auto usable = prepareFile(o);
    if (!usable) { return kExitIoError; }
    auto sh = std::make_unique<Shared>();
    sh->o = o;
    sh->blocks = *usable / o.bs;
    if (sh->blocks == 0) {
        return usage(fmt::format("{} holds {} bytes, less than one block of {}; give --size", o.file, *usable, o.bs));
    }
    sh->o.size = sh->blocks * o.bs;

    // One open file description per carrier, as fio opens the file once per job.
    std::vector<std::unique_ptr<CarrierState>> carriers;
    const int flags = (isRead(o.rw) ? O_RDONLY : O_WRONLY) | O_CLOEXEC | (o.direct ? O_DIRECT : 0);
    auto closeAll = [&] {
        for (auto& cs : carriers) {
            if (cs->fd >= 0) { ::close(cs->fd); }
        }
    };
    for (unsigned c = 0; c < o.carriers; ++c) {
        auto cs = std::make_unique<CarrierState>();
        cs->fd = ::open(o.file.c_str(), flags);
        if (cs->fd < 0) {
            const int err = errno;
            if (o.direct && err == EINVAL) {
                fmt::print(stderr, "spindle-iobench: open {} with O_DIRECT: {} (the file system refuses O_DIRECT)\n",
                           o.file, std::strerror(err));
            } else {
                fmt::print(stderr, "spindle-iobench: open {}: {}\n", o.file, std::strerror(err));
            }
            closeAll();
            return kExitIoError;
        }
        cs->seqCursor = sh->blocks * c / o.carriers * o.bs;  // carrier c streams from c/N of the file on
        carriers.push_back(std::move(cs));
    }

    spindle::RuntimeOptions ro;
    ro.carriers = o.carriers;
    ro.bindCarriers = !o.noBind;
    ro.deferTaskrun = !o.noDeferTaskrun;
    ro.backend = spindle::apps::backendFromFlag(o.backend);
    ro.workerCpus = spindle::apps::workerCpusFromFlag(o.workerCpus);
    ro.pollMode = spindle::apps::pollModeFromFlag(o.pollMode);
    ro.ringEntries = std::max(256u, std::bit_ceil(o.depth + 16));  // a whole depth fits in one batch
    if (o.fixedBuffers) {
        // One registered buffer per fiber in flight on each carrier, rounded up to whole pages.
        ro.fixedBufferCount = o.depth;
        ro.fixedBufferSize = static_cast<size_t>((o.bs + 4095) / 4096 * 4096);
    }
    auto rt = spindle::Runtime::start(ro);
    if (!rt) {
        fmt::print(stderr, "spindle-iobench: the runtime did not start: {}{}\n", rt.error().message(),
                   spindle::apps::startFailureNote(o.backend));
        closeAll();
        return kExitIoError;
    }

    const int64_t startNs = nowNs();
    sh->rampEndNs = startNs + static_cast<int64_t>(o.ramp * 1e9);
    sh->endNs = sh->rampEndNs + static_cast<int64_t>(o.duration * 1e9);
    std::vector<spindle::FiberHandle<void>> fibers;
    fibers.reserve(size_t{o.carriers} * o.depth);
    int spawnErr = 0;
    for (unsigned c = 0; c < o.carriers && spawnErr == 0; ++c) {
        for (unsigned d = 0; d < o.depth; ++d) {
            CarrierState& cs = *carriers[c];
            const SplitMix64 rng{o.seed ^ (uint64_t{c} << 32 | d) * 0x9e3779b97f4a7c15ull};
            Shared& shared = *sh;
            spindle::SpawnOptions so{.name = "iobench", .carrier = static_cast<int>(c), .pinned = true};
            auto h = rt->spawn(
                [&shared, &cs, rng] {
                    if (shared.o.fixedBuffers) {
                        fixedFiber(shared, cs, rng);
                    } else {
                        plainFiber(shared, cs, rng);
                    }
                },
                so);
            if (!h) {
                spawnErr = h.errorCode();
                break;
            }
            fibers.push_back(std::move(*h));
        }
    }
    Window win;
    if (spawnErr == 0) {
        std::this_thread::sleep_until(Clock::time_point(std::chrono::nanoseconds(sh->rampEndNs)));
        win.atStart = rt->stats();
        // Wake early if a fiber failed; otherwise at the end of the window.
        while (!sh->stop.load(std::memory_order_relaxed) && nowNs() < sh->endNs) {
            const int64_t left = sh->endNs - nowNs();
            std::this_thread::sleep_for(std::chrono::nanoseconds(std::min<int64_t>(left, 50'000'000)));
        }
        win.atEnd = rt->stats();
    }
    sh->stop.store(true, std::memory_order_relaxed);
    for (auto& f : fibers) { f.join(); }
    const std::string describe = rt->describe();
    const spindle::Backend backend = rt->backend();
    rt->shutdown();
    rt->join();
    closeAll();

    if (spawnErr != 0) {
        fmt::print(stderr, "spindle-iobench: spawning the I/O fibers failed: {}\n", std::strerror(spawnErr));
        return kExitIoError;
    }
    if (sh->failed.load()) {
        for (auto& cs : carriers) {
            const IoError& e = cs->error;
            if (e.what[0] == '\0') { continue; }
            if (e.err != 0) {
                fmt::print(stderr, "spindle-iobench: {} of {} bytes at offset {} on {}: {}\n", e.what, o.bs, e.offset,
                           o.file, std::strerror(e.err));
            } else {
                fmt::print(stderr, "spindle-iobench: short {} at offset {} on {}: {} of {} bytes\n", e.what, e.offset,
                           o.file, e.got, o.bs);
            }
            break;
        }
        return kExitIoError;
    }

    // Merge the carriers' histograms (on the heap: each is about 30 KiB).
    auto all = std::make_unique<spindle::LogLinearHistogram>();
    uint64_t ios = 0;
    for (auto& cs : carriers) {
        all->merge(cs->latency);
        ios += cs->ios;
    }
    const double seconds = static_cast<double>(sh->endNs - sh->rampEndNs) / 1e9;
    const double iops = static_cast<double>(ios) / seconds;
    const double mibs = iops * static_cast<double>(o.bs) / (1 << 20);
    const auto iopsInt = static_cast<uint64_t>(iops + 0.5);
    const uint64_t pcts[] = {all->min(),
                             static_cast<uint64_t>(all->mean() + 0.5),
                             all->percentile(0.50),
                             all->percentile(0.90),
                             all->percentile(0.99),
                             all->percentile(0.999),
                             all->max()};
    const char* pctNames[] = {"min", "avg", "p50", "p90", "p99", "p99.9", "max"};
    std::vector<std::string> latParts;
    for (size_t i = 0; i < std::size(pcts); ++i) { latParts.push_back(latencyField(pctNames[i], pcts[i])); }

    // Ring counters over the window (read racily at its two ends; the I/Os are those counted).
    struct CarrierLine {
        unsigned index;
        int pu;
        double iops;
        uint64_t enters, sqes, parks;
    };
    std::vector<CarrierLine> lines;
    for (unsigned c = 0; c < o.carriers; ++c) {
        CarrierLine l{c, -1, static_cast<double>(carriers[c]->ios) / seconds, 0, 0, 0};
        if (c < win.atStart.size() && c < win.atEnd.size()) {
            l.pu = win.atEnd[c].pu;
            l.enters = win.atEnd[c].enters - win.atStart[c].enters;
            l.sqes = win.atEnd[c].sqesSubmitted - win.atStart[c].sqesSubmitted;
            l.parks = win.atEnd[c].parks - win.atStart[c].parks;
        }
        lines.push_back(l);
    }
    const std::string ring = win.atEnd.empty() ? "" : win.atEnd[0].ring;

    if (o.json) {
        // One object on one line, through nlohmann::json: any path (quotes, backslashes, control bytes)
        // comes out as a valid JSON string. The keys keep the order of the text report.
        nlohmann::ordered_json out;
        out["rw"] = o.rwName;
        out["bs"] = o.bs;
        out["depth_per_carrier"] = o.depth;
        out["carriers"] = o.carriers;
        out["duration_s"] = o.duration;
        out["ramp_s"] = o.ramp;
        out["direct"] = o.direct;
        out["fixed_buffers"] = o.fixedBuffers;
        out["backend"] = spindle::toString(backend);
        out["file"] = o.file;
        out["size"] = sh->o.size;
        out["ios"] = ios;
        out["iops"] = iops;
        out["bw_mib_s"] = mibs;
        nlohmann::ordered_json lat = nlohmann::ordered_json::object();
        for (size_t i = 0; i < std::size(pcts); ++i) { lat[pctNames[i]] = static_cast<double>(pcts[i]) / 1000.0; }
        out["lat_us"] = std::move(lat);
        nlohmann::ordered_json perCarrier = nlohmann::ordered_json::array();
        for (const auto& l : lines) {
            perCarrier.push_back({{"index", l.index}, {"pu", l.pu}, {"iops", l.iops}, {"enters", l.enters},
                                  {"sqes", l.sqes}, {"parks", l.parks}});
        }
        out["per_carrier"] = std::move(perCarrier);
        // A path that is not UTF-8 is written with U+FFFD in place of its bad bytes rather than throwing.
        fmt::print("{}\n", out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
        return 0;
    }
    fmt::print("spindle-iobench: {} bs={} depth={}/carrier carriers={} duration={}s ramp={}s direct={} "
               "fixed-buffers={} backend={}\n",
               o.rwName, o.bs, o.depth, o.carriers, o.duration, o.ramp, o.direct ? 1 : 0, o.fixedBuffers ? 1 : 0,
               spindle::toString(backend));
    fmt::print("  file      : {} ({} used)\n", o.file, humanBytes(sh->o.size));
    fmt::print("  runtime   : {}\n", describe);
    fmt::print("  driver    : {}\n", ring);
    fmt::print("  I/Os      : {} in {:.3f} s\n", ios, seconds);
    fmt::print("  bandwidth : {:.2f} MiB/s\n", mibs);
    fmt::print("  latency   : (us) {}\n", fmt::join(latParts, "  "));
    // The driver's counters under its own names: io_uring_enter calls and SQEs, or epoll_wait calls and
    // operations started (on epoll, file I/O runs on the offload pool).
    const bool uring = backend == spindle::Backend::kUring;
    for (const auto& l : lines) {
        const double perIo = carriers[l.index]->ios > 0 ? static_cast<double>(carriers[l.index]->ios) : 1.0;
        fmt::print("  carrier {} : PU {:>2}  IOPS {}  {}/IO {:.3f}  {}/enter {:.2f}  parks/IO {:.3f}\n", l.index, l.pu,
                   static_cast<uint64_t>(l.iops + 0.5), uring ? "io_uring_enter" : "epoll_wait",
                   static_cast<double>(l.enters) / perIo, uring ? "SQEs" : "ops",
                   l.enters > 0 ? static_cast<double>(l.sqes) / static_cast<double>(l.enters) : 0.0,
                   static_cast<double>(l.parks) / perIo);
    }
    fmt::print("IOPS: {}\n", iopsInt);
    return 0;
}
