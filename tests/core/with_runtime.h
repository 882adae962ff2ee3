// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The fixture and helpers the core and stress tests share (STYLE snippet 5): a runtime of two carriers
/// (two even on a one-core machine, so that the cross-carrier paths always run), a TearDown that fails the
/// test if a fiber outlived it, a watchdog that turns a lost wake-up into a loud abort, polling helpers,
/// and a scratch directory for the file-system tests.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <stop_token>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "core/fiber.h"
#include "core/fiber_semaphore.h"
#include "core/internal/waiter_table.h"
#include "core/driver/backend.h"
#include "core/runtime.h"
#include "testing/scratch_dir.h"

namespace spindle::testing_support {

/// Whether this build runs under ASan or TSan: tests shrink their loop counts there, never their checks.
#if defined(SPINDLE_TSAN) || defined(SPINDLE_ASAN)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

/// Whether these tests run under an emulator (the aarch64 flavour: qemu-user, each test program on one
/// host CPU, so that every hand-over between two carriers waits for a time slice).
#if defined(SPINDLE_TEST_EMULATED)
inline constexpr bool kEmulated = true;
#else
inline constexpr bool kEmulated = false;
#endif

/// Where a round of a race test is slow (sanitizers, emulation): such tests run fewer rounds, with the
/// same checks in each.
inline constexpr bool kSlowRounds = kSanitized || kEmulated;

/// The backend this test process runs on: SPINDLE_BACKEND's (ctest runs every suite once with
/// "epoll"), else io_uring where it can be set up.
inline Backend testBackend() { return detail::threadBackend(); }

/// Skips the calling test on a backend without the io_uring mechanism it exercises, naming it; the
/// skip message starts with "io_uring only" so that scripts/test can count these skips.
#define SPINDLE_REQUIRE_URING(what)                                                                       \
    do {                                                                                                \
        if (::spindle::testing_support::testBackend() != ::spindle::Backend::kUring) {                  \
            GTEST_SKIP() << "io_uring only: " << (what) << " (backend "                                \
                         << ::spindle::toString(::spindle::testing_support::testBackend()) << ")";   \
        }                                                                                               \
    } while (0)

/// Skips the calling test on every backend but io_uring when what it exercises does not depend on the
/// backend (the stack pool, the scheduler without I/O) and it is too long to run twice for nothing; where
/// io_uring cannot be set up at all (qemu-user) it runs on what there is. The skip message starts with
/// "backend-independent".
#define SPINDLE_ONE_BACKEND_ENOUGH(what)                                                                  \
    do {                                                                                                \
        if (::spindle::testing_support::testBackend() != ::spindle::Backend::kUring &&                  \
            ::spindle::detail::probeUring().setupError == 0) {                                           \
            GTEST_SKIP() << "backend-independent: " << (what) << "; run on io_uring";                   \
        }                                                                                               \
    } while (0)

/// Options for a runtime of `n` carriers and defaults otherwise.
inline RuntimeOptions withCarriers(unsigned n) {
    RuntimeOptions o;
    o.carriers = n;
    return o;
}

/// liveFibers() once it stops changing, waiting at most 10 s: detached fibers that
/// are finishing get a moment; a leaked fiber stays counted and fails the test.
inline uint64_t settledLiveFibers(const Runtime& rt) {
    using namespace std::chrono_literals;
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (rt.liveFibers() != 0 && std::chrono::steady_clock::now() < deadline) { std::this_thread::sleep_for(1ms); }
    return rt.liveFibers();
}

/// Aborts the process with a message if `progress` (which must outlive it) stops changing for `limit`.
class Watchdog {
public:
    Watchdog(const char* what, const std::atomic<uint64_t>& progress, std::chrono::seconds limit)
        : thread_([what, &progress, limit](std::stop_token st) {
              using namespace std::chrono_literals;
              uint64_t last = progress.load();
              auto lastChange = std::chrono::steady_clock::now();
              while (!st.stop_requested()) {
                  std::this_thread::sleep_for(20ms);
                  const uint64_t now = progress.load();
                  if (now != last) {
                      last = now;
                      lastChange = std::chrono::steady_clock::now();
                  } else if (std::chrono::steady_clock::now() - lastChange > limit) {
                      std::fprintf(stderr, "watchdog: %s made no progress for %lld s (stuck at %llu); aborting\n",
                                   what, static_cast<long long>(limit.count()), static_cast<unsigned long long>(now));
                      std::abort();
                  }
              }
          }) {}

private:
    std::jthread thread_;  // stopped and joined by its destructor
};

/// A lock that a fiber may hold while it parks: one permit of a FiberSemaphore.
class SemLock {
public:
    void lock() noexcept { sem_.acquire(); }
    void unlock() noexcept { sem_.release(); }
    bool try_lock() noexcept { return sem_.try_acquire(); }
    /// Whether the lock is taken (meaningful only while nobody queues for it).
    [[nodiscard]] bool taken() const noexcept { return sem_.available() == 0; }

private:
    FiberSemaphore sem_{1};
};

/// Yields (the fiber, or the thread) until pred() holds.
template <class Pred>
void yieldUntil(Pred pred) {
    while (!pred()) { this_fiber::yield(); }
}

/// Polls, yielding the thread, until `key` has `n` waiters queued in `table`.
inline void awaitWaiters(const detail::WaiterTable& table, const void* key, size_t n) {
    while (table.countWaiters(key) != n) { std::this_thread::yield(); }
}

/// Polls, yielding the thread, until `key` has `n` waiters queued in the process's waiter table.
inline void awaitWaiters(const void* key, size_t n) { awaitWaiters(detail::WaiterTable::instance(), key, n); }

/// A runtime of two carriers for each test; TearDown fails the test if a fiber outlived it.
class WithRuntime : public testing::Test {
protected:
    void SetUp() override {
        auto rt = Runtime::start(withCarriers(2));
        ASSERT_TRUE(rt) << "Runtime::start: " << rt.error().message();
        runtime_.emplace(std::move(*rt));
    }
    void TearDown() override {
        if (runtime_) { EXPECT_EQ(settledLiveFibers(*runtime_), 0u); }
    }

    Runtime& rt() { return *runtime_; }

    /// Starts fn pinned to `carrier` (aborts the test binary if it cannot).
    template <class F>
    auto on(int carrier, F&& fn, const char* name = nullptr) {
        return runtime_->spawn(std::forward<F>(fn), SpawnOptions{.name = name, .carrier = carrier, .pinned = true})
            .value();
    }

    /// Starts fn on `carrier`, not pinned: it may be stolen and so move between threads.
    template <class F>
    auto onUnpinned(int carrier, F&& fn) {
        return runtime_->spawn(std::forward<F>(fn), SpawnOptions{.carrier = carrier}).value();
    }

    /// Starts fn on whichever carrier the runtime picks, not pinned.
    template <class F>
    auto anywhere(F&& fn) {
        return runtime_->spawn(std::forward<F>(fn)).value();
    }

    /// Runs fn on a fiber and returns its value (rethrows its exception).
    template <class F>
    auto onFiber(F&& fn, int carrier = SpawnOptions::kAnyCarrier) {
        return runtime_->spawn(std::forward<F>(fn), SpawnOptions{.carrier = carrier}).value().join();
    }

    std::optional<Runtime> runtime_;
};

/// Both ends of a pipe (O_CLOEXEC), closed on destruction unless closed already.
struct Pipe {
    int r = -1;
    int w = -1;
    Pipe() {
        int p[2];
        if (::pipe2(p, O_CLOEXEC) == 0) {
            r = p[0];
            w = p[1];
        } else {
            ADD_FAILURE() << "pipe2: " << std::strerror(errno);
        }
    }
    ~Pipe() {
        closeWrite();
        if (r >= 0) { ::close(r); }
    }
    Pipe(const Pipe&) = delete;
    Pipe& operator=(const Pipe&) = delete;
    [[nodiscard]] int readEnd() const { return r; }
    [[nodiscard]] int writeEnd() const { return w; }
    void closeWrite() {
        if (w >= 0) { ::close(std::exchange(w, -1)); }
    }
    /// Bytes waiting in the pipe (FIONREAD), -1 on error.
    [[nodiscard]] int queued() const {
        int n = -1;
        return ::ioctl(r, FIONREAD, &n) == 0 ? n : -1;
    }
};

/// `n` bytes of a fixed pseudo-random sequence picked by `seed`.
inline std::vector<char> pattern(size_t n, unsigned seed) {
    std::vector<char> v(n);
    uint32_t x = seed * 2654435761u + 1;
    for (auto& c : v) {
        x = x * 1664525u + 1013904223u;
        c = static_cast<char>(x >> 24);
    }
    return v;
}

/// WithRuntime plus a scratch directory that outlives the runtime's TearDown check.
class WithScratchDir : public WithRuntime {
protected:
    void SetUp() override {
        WithRuntime::SetUp();
        if (HasFatalFailure()) { return; }
        scratch_.emplace();
        ASSERT_TRUE(scratch_->ok()) << "mkdtemp under " << std::filesystem::temp_directory_path();
        dir_ = scratch_->dir();
    }
    void TearDown() override {
        WithRuntime::TearDown();
        scratch_.reset();
    }

    std::string path(const char* name) const { return scratch_->path(name); }

    /// A fresh file opened read-write with ::open.
    int makeFile(const char* name) {
        const int fd = ::open(path(name).c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        EXPECT_GE(fd, 0) << std::strerror(errno);
        return fd;
    }

    std::string dir_;  // the scratch directory's path
    std::optional<ScratchDir> scratch_;
};

}  // namespace spindle::testing_support
