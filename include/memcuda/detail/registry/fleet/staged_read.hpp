// The reading side of staged device memory (stager.hpp): another node's
// device tensor copied into this process's device memory a chunk at a
// time. Three stages overlap: that node copies chunk i+1 into its ring
// while the mover reads chunk i into one of two pinned landing buffers
// here, and chunk i-1 goes from the other onto the device. The next two
// asks go out before a chunk is read, so a pull holds at most three of the
// ring's slots.
//
// One pull lane's at a time (puller.hpp): the landing buffers are made on
// the first staged read and kept.
#pragma once

#include "memcuda/config.hpp"

#if MEMCUDA_HAS_CUDA()

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>

#include "memcuda/detail/base/node.hpp"
#include "memcuda/detail/cuda/handles.hpp"
#include "memcuda/detail/store/keys.hpp"
#include "memcuda/detail/store/lists.hpp"
#include "memcuda/detail/transfer/mover.hpp"
#include "memcuda/protocol/stage.hpp"
#include "memcuda/tensor_info.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class StagedReader {
 public:
  using Deadline = std::chrono::steady_clock::time_point;

  // `seq` numbers the reply lists of the session's asks (shared by its
  // readers); `progress` is set each time a chunk has landed.
  StagedReader(std::atomic<std::uint64_t>& seq, std::atomic<Deadline>& progress) : seq_(seq), progress_(progress) {}

  // Copies the `bytes` of `from` (a ready device tensor of node `from.node`,
  // whose stager's ring is `ring`) into dst, device memory of `device` in
  // this process. Throws what that node's stager refused with, Lost when it
  // stopped answering or the mover failed; nothing is read into dst after
  // it returns or throws.
  void read(redis::Connection& c, const Keys& k, const std::string& session, transfer::Mover& m,
            const transfer::RemoteRegion& ring, const TensorInfo& from, void* dst, int device, Deadline deadline) {
    constexpr std::size_t kChunk = protocol::kStageChunkBytes;
    if (!landing_) landing_.emplace(2 * kChunk);
    const std::string list = k.stage(node_scope(from.node));
    const std::size_t n = (from.bytes + kChunk - 1) / kChunk;
    struct Ask {
      std::string reply;
      Deadline sent;
    };
    std::deque<Ask> out;
    std::optional<protocol::StageRelease> held;
    auto ask = [&](std::size_t i) {
      protocol::StageRequest q{from.name, from.generation, i * kChunk, std::min<std::uint64_t>(kChunk, from.bytes - i * kChunk),
                               k.stage_reply(session, ++seq_)};
      out.push_back({q.reply_to, std::chrono::steady_clock::now()});
      c.command({"RPUSH", list, protocol::encode_stage(q)});
    };
    auto unstage = [&]() {
      if (held) c.command({"RPUSH", list, protocol::encode_unstage(*held)});
      held.reset();
    };
    UniqueStream stream(device);
    UniqueEvent landed[2] = {UniqueEvent(device), UniqueEvent(device)};
    try {
      ask(0);
      if (n > 1) ask(1);
      for (std::size_t i = 0; i < n; ++i) {
        const Ask a = out.front();
        out.pop_front();
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        auto t = std::chrono::steady_clock::now();
        auto r = store::pop_wait(c, a.reply, std::max(left, std::chrono::milliseconds(1)));
        times_.waited += std::chrono::steady_clock::now() - t;
        if (r.is_nil())
          throw Lost("tensor '" + from.name + "': node " + from.node + " did not stage chunk " + std::to_string(i) +
                     " in time; nothing of it was published here");
        const protocol::StageGrant g = protocol::decode_grant(r[1].str());
        held = protocol::StageRelease{g.slot, g.ticket};
        if (i + 2 < n) ask(i + 2);
        const std::size_t len = std::min<std::uint64_t>(kChunk, from.bytes - i * kChunk);
        unsigned char* land = landing_->get() + (i % 2) * kChunk;
        t = std::chrono::steady_clock::now();
        MEMCUDA_CUDA_TRY(cudaEventSynchronize(landed[i % 2].get()));  // its last chunk is on the device
        times_.landing += std::chrono::steady_clock::now() - t;
        t = std::chrono::steady_clock::now();
        // Read within the slot's lease, counted from before the ask.
        const auto until = std::min(deadline, a.sent + std::chrono::milliseconds(g.lease_ms) - std::chrono::seconds(1));
        try {
          m.get(ring, g.offset, land, len, until);
        } catch (const transfer::TransferError& e) {
          throw Lost("tensor '" + from.name + "': node " + from.node + " stopped serving it mid-pull (" + e.what() +
                     "); nothing of it was published here");
        }
        times_.got += std::chrono::steady_clock::now() - t;
        ++times_.chunks;
        unstage();
        progress_.store(std::chrono::steady_clock::now());
        MEMCUDA_CUDA_TRY(cudaMemcpyAsync(static_cast<char*>(dst) + i * kChunk, land, len, cudaMemcpyHostToDevice,
                                         stream.get()));
        MEMCUDA_CUDA_TRY(cudaEventRecord(landed[i % 2].get(), stream.get()));
      }
      MEMCUDA_CUDA_TRY(cudaStreamSynchronize(stream.get()));
    } catch (...) {
      // The slot read last goes back now; the asks still out lapse with
      // their leases. The copies enqueued finish before the buffers are
      // used again.
      try {
        unstage();
      } catch (const std::exception&) {
      }
      (void)cudaStreamSynchronize(stream.get());
      (void)cudaGetLastError();
      throw;
    }
  }

  // Where its reads spent their time (the debug log's): waiting for the
  // stager's grants, in the mover's gets, waiting for a landing buffer.
  struct Times {
    std::chrono::steady_clock::duration waited{}, got{}, landing{};
    std::uint64_t chunks = 0;
    Times& operator+=(const Times& t) noexcept {
      waited += t.waited, got += t.got, landing += t.landing, chunks += t.chunks;
      return *this;
    }
    std::string describe() const {  // "" when nothing was staged
      if (!chunks) return {};
      auto ms = [](auto d) { return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()); };
      return "; " + std::to_string(chunks) + " staged chunk(s): " + ms(waited) + " ms waiting for grants, " + ms(got) +
             " ms in gets, " + ms(landing) + " ms waiting for a landing buffer (lanes summed)";
    }
  };
  Times take_times() noexcept { return std::exchange(times_, {}); }

 private:
  Times times_;
  std::optional<PinnedBuffer> landing_;
  std::atomic<std::uint64_t>& seq_;
  std::atomic<Deadline>& progress_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

#endif  // MEMCUDA_HAS_CUDA()
