// SPDX-License-Identifier: Apache-2.0
#pragma once
/// spindle::apps::Json, a JSON value the apps build their --json and --stats-json output with: a thin
/// wrapper over nlohmann::ordered_json, which escapes every string (quotes, backslashes, control bytes;
/// bytes that are not UTF-8 become U+FFFD) and keeps the keys in the order they were set.
///
/// Why a wrapper: nlohmann/json.hpp adds about 5 s of compile time to each translation unit that
/// includes it; behind this header only apps/common/json.cpp pays it, once per build.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <nlohmann/json_fwd.hpp>

namespace spindle::apps {

class Json {
public:
    /// null
    Json();
    Json(std::nullptr_t);
    Json(bool value);
    template <std::integral T>
        requires(!std::same_as<T, bool>)
    Json(T value) : Json(fromInteger(value)) {}
    Json(double value);
    Json(std::string_view text);
    Json(const std::string& text) : Json(std::string_view(text)) {}
    Json(const char* text) : Json(std::string_view(text)) {}
    /// An object with these members, in this order: Json{{"name", "x"}, {"count", 3}}.
    Json(std::initializer_list<std::pair<std::string_view, Json>> members);
    ~Json();
    Json(const Json& other);
    Json(Json&& other);  // allocates (value_ is never null) and leaves `other` null
    Json& operator=(const Json& other);
    Json& operator=(Json&& other);

    /// An empty array, for push().
    [[nodiscard]] static Json array();
    /// An empty object, for set().
    [[nodiscard]] static Json object();
    /// Appends `value`. Precondition: this is an array.
    Json& push(Json value);
    /// Sets member `key` (added last when it is new). Precondition: this is an object (or null, which
    /// becomes one).
    Json& set(std::string_view key, Json value);
    /// The value on one line, without a newline.
    [[nodiscard]] std::string dump() const;

private:
    [[nodiscard]] static Json fromInteger(std::integral auto value) {
        if constexpr (std::is_signed_v<decltype(value)>) {
            return fromSigned(static_cast<int64_t>(value));
        } else {
            return fromUnsigned(static_cast<uint64_t>(value));
        }
    }
    [[nodiscard]] static Json fromSigned(int64_t value);
    [[nodiscard]] static Json fromUnsigned(uint64_t value);

    std::unique_ptr<nlohmann::ordered_json> value_;  // never null
};

}  // namespace spindle::apps
