// SPDX-License-Identifier: Apache-2.0
#include "apps/common/json.h"

#include <nlohmann/json.hpp>

namespace spindle::apps {

Json::Json() : value_(std::make_unique<nlohmann::ordered_json>()) {}
Json::Json(std::nullptr_t) : Json() {}
Json::Json(bool value) : value_(std::make_unique<nlohmann::ordered_json>(value)) {}
Json::Json(double value) : value_(std::make_unique<nlohmann::ordered_json>(value)) {}
Json::Json(std::string_view text) : value_(std::make_unique<nlohmann::ordered_json>(std::string(text))) {}
Json::Json(std::initializer_list<std::pair<std::string_view, Json>> members)
    : value_(std::make_unique<nlohmann::ordered_json>(nlohmann::ordered_json::object())) {
    for (const auto& [key, value] : members) { (*value_)[std::string(key)] = *value.value_; }
}
Json::~Json() = default;
Json::Json(const Json& other) : value_(std::make_unique<nlohmann::ordered_json>(*other.value_)) {}
Json::Json(Json&& other) : value_(std::make_unique<nlohmann::ordered_json>(std::move(*other.value_))) {}
Json& Json::operator=(const Json& other) {
    *value_ = *other.value_;
    return *this;
}
Json& Json::operator=(Json&& other) {
    *value_ = std::move(*other.value_);
    return *this;
}

Json Json::array() {
    Json out;
    *out.value_ = nlohmann::ordered_json::array();
    return out;
}

Json Json::object() {
    Json out;
    *out.value_ = nlohmann::ordered_json::object();
    return out;
}

Json& Json::push(Json value) {
    value_->push_back(std::move(*value.value_));
    return *this;
}

Json& Json::set(std::string_view key, Json value) {
    (*value_)[std::string(key)] = std::move(*value.value_);
    return *this;
}

std::string Json::dump() const {
    return value_->dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

Json Json::fromSigned(int64_t value) {
    Json out;
    *out.value_ = value;
    return out;
}

Json Json::fromUnsigned(uint64_t value) {
    Json out;
    *out.value_ = value;
    return out;
}

}  // namespace spindle::apps
