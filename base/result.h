// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Result<T>: a value or an errno-valued error, shaped like std::expected<T, std::error_code>.
///
/// Every public call in spindle that can fail returns a Result. The error is kept
/// as a plain errno (`int`), so a Result<size_t> is 16 bytes and costs nothing
/// to build on the I/O path; error() turns it into a std::error_code on demand.
///
/// Errors: value() on an error throws std::system_error carrying the errno and
/// the context string, for callers that prefer exceptions off the hot path;
/// operator* and operator-> do not check (a debug build asserts).
/// Thread-safety: a Result is a plain value.

#include <cerrno>
#include <new>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

#include "base/check.h"

namespace spindle {

/// Tag that carries an errno into a Result; `return Error{EBADF};`.
struct Error {
    int code;
};

/// Builds an Error from a negative kernel result (`-errno`).
[[nodiscard]] constexpr Error errorFromRes(int res) noexcept { return Error{-res}; }

template <class T>
class [[nodiscard]] Result {
    static_assert(!std::is_reference_v<T>, "Result<T&> is not supported");

public:
    using value_type = T;

    Result(const T& v) noexcept(std::is_nothrow_copy_constructible_v<T>) : err_(0) {  // NOLINT
        new (&value_) T(v);
    }
    Result(T&& v) noexcept(std::is_nothrow_move_constructible_v<T>) : err_(0) {  // NOLINT
        new (&value_) T(std::move(v));
    }
    Result(Error e) noexcept : err_(e.code) {  // NOLINT
        SPINDLE_ASSERT(e.code > 0 && "an Error carries a positive errno");
    }
    Result(const Result& o) noexcept(std::is_nothrow_copy_constructible_v<T>) : err_(o.err_) {
        if (err_ == 0) { new (&value_) T(o.value_); }
    }
    Result(Result&& o) noexcept(std::is_nothrow_move_constructible_v<T>) : err_(o.err_) {
        if (err_ == 0) { new (&value_) T(std::move(o.value_)); }
    }
    Result& operator=(Result o) noexcept(std::is_nothrow_move_constructible_v<T>) {
        if (this != &o) {
            destroy();
            err_ = o.err_;
            if (err_ == 0) { new (&value_) T(std::move(o.value_)); }
        }
        return *this;
    }
    ~Result() { destroy(); }

    [[nodiscard]] bool ok() const noexcept { return err_ == 0; }
    explicit operator bool() const noexcept { return ok(); }

    /// The errno, or 0 when a value is held.
    [[nodiscard]] int errorCode() const noexcept { return err_; }
    [[nodiscard]] std::error_code error() const noexcept {
        return std::error_code(err_, std::system_category());
    }

    T& operator*() & noexcept { SPINDLE_ASSERT(ok()); return value_; }
    const T& operator*() const& noexcept { SPINDLE_ASSERT(ok()); return value_; }
    T&& operator*() && noexcept { SPINDLE_ASSERT(ok()); return std::move(value_); }
    T* operator->() noexcept { SPINDLE_ASSERT(ok()); return &value_; }
    const T* operator->() const noexcept { SPINDLE_ASSERT(ok()); return &value_; }

    /// The value; throws std::system_error when an error is held.
    T& value() & { throwIfError(); return value_; }
    const T& value() const& { throwIfError(); return value_; }
    T&& value() && { throwIfError(); return std::move(value_); }

    template <class U>
    T valueOr(U&& fallback) const& { return ok() ? value_ : static_cast<T>(std::forward<U>(fallback)); }

private:
    void destroy() noexcept {
        if (err_ == 0) { value_.~T(); }
    }
    void throwIfError() const {
        if (err_ != 0) { throw std::system_error(error()); }
    }

    int err_;
    union {
        T value_;
    };
};

template <>
class [[nodiscard]] Result<void> {
public:
    using value_type = void;

    Result() noexcept : err_(0) {}
    Result(Error e) noexcept : err_(e.code) {  // NOLINT
        SPINDLE_ASSERT(e.code > 0 && "an Error carries a positive errno");
    }

    [[nodiscard]] bool ok() const noexcept { return err_ == 0; }
    explicit operator bool() const noexcept { return ok(); }
    [[nodiscard]] int errorCode() const noexcept { return err_; }
    [[nodiscard]] std::error_code error() const noexcept {
        return std::error_code(err_, std::system_category());
    }
    /// Throws std::system_error when an error is held.
    void value() const {
        if (err_ != 0) { throw std::system_error(error()); }
    }

private:
    int err_;
};

/// Maps a kernel-style result (`>= 0` value, `< 0` is `-errno`) to Result<void>.
[[nodiscard]] inline Result<void> voidFromRes(int res) noexcept {
    if (res < 0) { return Error{-res}; }
    return {};
}

}  // namespace spindle
