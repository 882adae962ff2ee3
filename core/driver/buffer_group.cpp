// SPDX-License-Identifier: Apache-2.0
#include "core/driver/buffer_group.h"

#include "base/check.h"

namespace spindle::detail {

BufferGroup::BufferGroup(char* base, size_t size, unsigned count)
    : base_(base), size_(size), count_(count), free_(new uint16_t[count]), out_(new uint8_t[count]()), freeCount_(count) {
    SPINDLE_CHECK_MSG(count >= 1 && count <= 65536, "a buffer group holds 1 to 65536 buffers");
    // Taken from the top: buffer 0 goes out first.
    for (unsigned i = 0; i < count; ++i) { free_[i] = static_cast<uint16_t>(count - 1 - i); }
    returns_.init(count, nullptr, &BufferGroup::onReturn, this);
}

void BufferGroup::bindOwner(Carrier* owner) { returns_.init(count_, owner, &BufferGroup::onReturn, this); }

void BufferGroup::freeHere(uint16_t bid) noexcept {
    SPINDLE_CHECK_MSG(bid < count_ && out_[bid] != 0, "a buffer given back to its group that is not out");
    out_[bid] = 0;
    free_[freeCount_++] = bid;
}

}  // namespace spindle::detail
