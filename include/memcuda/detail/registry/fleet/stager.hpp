// A fleet node's staging of its device memory for other nodes' pulls
// (docs/scale-out.md, section 2). A mover without CUDA support (Debian's
// UCX) reads host memory only, so a node that pulls a device tensor of this
// one asks for it a chunk at a time on `memcuda:stage@<scope>`
// (protocol/stage.hpp): this node's allocator of record copies the chunk
// into a slot of a pinned ring that its mover exposes (the node record's
// "stage" field), answers with the slot, and the asker reads it from there
// while it copies the previous chunk onward. Memory is bounded: kSlots
// slots of kChunk bytes; an ask waits while every slot is taken.
//
// A slot is the asker's until it says "unstage" or its lease passes; an
// asker reads it only within the lease counted from before it asked, so a
// slot given to another never has two readers' bytes in it at once.
// Asks are served in their order (askers RPUSH, the stager pops the left).
//
// Its own thread and Redis connection: a pull of this node, which runs on
// the control thread and may wait on another node's stager, never waits on
// its own control thread, so two nodes pulling from each other go on.
#pragma once

#include "memcuda/config.hpp"

#if MEMCUDA_HAS_CUDA()

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "memcuda/detail/backend/process_cache.hpp"
#include "memcuda/detail/base/log.hpp"
#include "memcuda/detail/base/node.hpp"
#include "memcuda/detail/cuda/handles.hpp"
#include "memcuda/detail/cuda/ipc_event.hpp"
#include "memcuda/detail/process/process.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/store/lists.hpp"
#include "memcuda/detail/store/records.hpp"
#include "memcuda/detail/store/reply.hpp"
#include "memcuda/detail/transfer/mover.hpp"
#include "memcuda/protocol/record.hpp"
#include "memcuda/protocol/stage.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class Stager {
 public:
  static constexpr std::size_t kChunk = protocol::kStageChunkBytes;
  static constexpr std::size_t kSlots = 16;
  static constexpr std::chrono::milliseconds kLease{10000};

  // Makes the ring (pinned, exposed through `m`) and starts serving.
  // Throws CudaError, Unavailable (the mover refused the ring).
  Stager(Context& ctx, transfer::Mover& m)
      : ctx_(ctx), list_(ctx.keys.stage(node_scope(ctx.node))), ring_(kSlots * kChunk),
        region_(m.expose(ring_.get(), ring_.bytes(), transfer::MemoryKind::host)), slots_(kSlots) {
    thread_ = std::jthread([this](std::stop_token st) { run(st); });
  }
  // Stops the thread (its pop returns within kPoll); no network I/O here.
  ~Stager() {
    thread_.request_stop();
    if (thread_.joinable()) thread_.join();
  }
  Stager(const Stager&) = delete;
  Stager& operator=(const Stager&) = delete;

  const transfer::Region& region() const noexcept { return region_; }

 private:
  struct Slot {
    std::uint64_t ticket = 0;  // 0: free
    std::chrono::steady_clock::time_point until;
  };
  static constexpr std::chrono::milliseconds kPoll{200};
  static constexpr std::size_t kMaxAsks = 256;  // waiting asks; more are dropped (their askers time out)

  void run(const std::stop_token& st) {
    std::optional<redis::Connection> c;
    while (!st.stop_requested()) {
      try {
        if (!c) c.emplace(ctx_.opts.redis);
        const bool busy = !asks_.empty();  // waiting for a slot: poll the list briefly
        redis::Reply r;
        try {
          r = store::pop_wait(*c, list_, busy ? std::chrono::milliseconds(10) : kPoll);
        } catch (const ReplyError& e) {
          if (e.prefix() != "WRONGTYPE") throw;
          drop_list(*c);  // only the pop's own WRONGTYPE says the list is another client's key
          continue;
        }
        if (!r.is_nil()) take(r[1].str());
        serve(*c);
      } catch (const std::exception& e) {  // Redis away, a replica that refuses writes, ...
        log(LogLevel::warn, std::string("fleet stager: ") + e.what());
        c.reset();
        std::this_thread::sleep_for(kPoll);
      }
    }
  }

  // Another client's key of another type under the list's name: gone, so
  // that the node serves its stages again (docs/operations.md).
  void drop_list(redis::Connection& c) noexcept {
    try {
      log(LogLevel::warn, "fleet stager: '" + list_ + "' is not a list: deleted");
      c.command({"DEL", list_});
    } catch (const std::exception&) {
    }
  }

  void take(std::string_view text) {
    protocol::StageMessage m;
    try {
      m = protocol::decode_stage_message(text);
    } catch (const std::exception& e) {
      log(LogLevel::warn, std::string("fleet stager: dropped a malformed message: ") + e.what());
      return;
    }
    if (m.unstage) {
      if (m.unstage->slot < slots_.size() && slots_[m.unstage->slot].ticket == m.unstage->ticket)
        slots_[m.unstage->slot].ticket = 0;
      return;
    }
    if (asks_.size() >= kMaxAsks) {
      log(LogLevel::warn, "fleet stager: " + std::to_string(kMaxAsks) + " asks wait already: dropped one for '" +
                              m.stage->name.substr(0, 80) + "'");
      return;
    }
    asks_.push_back(std::move(*m.stage));
  }

  // Serves the waiting asks while a slot is free (those whose lease passed
  // are free again).
  void serve(redis::Connection& c) {
    const auto now = std::chrono::steady_clock::now();
    for (auto& s : slots_)
      if (s.ticket && now >= s.until) s.ticket = 0;
    while (!asks_.empty()) {
      std::size_t i = 0;
      while (i < slots_.size() && slots_[i].ticket) ++i;
      if (i == slots_.size()) return;
      protocol::StageRequest q = std::move(asks_.front());
      asks_.pop_front();
      if (!q.reply_to.starts_with(ctx_.keys.reply(""))) {
        log(LogLevel::warn, "fleet stager: dropped an ask whose reply list '" + q.reply_to.substr(0, 80) +
                                "' is not a reply list of this namespace");
        continue;
      }
      std::string answer;
      try {
        stage(c, q, i);
        slots_[i] = {next_ticket(), std::chrono::steady_clock::now() + kLease};
        answer = protocol::encode_grant({i, slots_[i].ticket, i * kChunk, static_cast<std::uint64_t>(kLease.count())});
      } catch (const IoError&) {
        asks_.push_front(std::move(q));  // served again once Redis answers
        throw;
      } catch (const std::exception& e) {
        answer = protocol::encode_reply(protocol::make_error_reply(nullptr, e));
      }
      try {
        c.pipeline({{"RPUSH", q.reply_to, answer}, {"PEXPIRE", q.reply_to, "60000"}});
      } catch (const ReplyError& e) {  // a reply key of another type: that asker's loss alone
        slots_[i].ticket = 0;
        log(LogLevel::warn, "fleet stager: answering on '" + q.reply_to.substr(0, 80) + "': " + e.what());
      } catch (const IoError&) {
        slots_[i].ticket = 0;
        asks_.push_front(std::move(q));
        throw;
      }
    }
  }

  // Tickets start at a random point per stager, so that an unstage left
  // over from an earlier stager of this session (a lease lost and won
  // back), or guessed, does not free a slot someone is reading.
  std::uint64_t next_ticket() {
    if (tickets_ == 0) tickets_ = (std::uint64_t{std::random_device{}()} << 32 | std::random_device{}()) | 1;
    return ++tickets_;
  }

  // Copies the asked bytes of a ready device tensor this process owns
  // into slot `slot`, after the producer's last published writes.
  void stage(redis::Connection& c, const protocol::StageRequest& q, std::size_t slot) {
    if (!is_valid_name(q.name)) throw InvalidArgument("stage: '" + q.name.substr(0, 80) + "' is no tensor name");
    auto r = store::read_record(c, ctx_.keys.tensor(q.name));
    if (r.size() == 0) throw NotFound("stage: no tensor named '" + q.name + "'");
    const TensorInfo t = protocol::decode_record(fields_from_reply(r.view()));
    if (t.generation != q.generation)
      throw StaleHandle("stage: '" + q.name + "' is generation " + std::to_string(t.generation) + ", not " +
                        std::to_string(q.generation));
    if (t.backend != BackendKind::cuda || t.state != TensorState::ready)
      throw InvalidArgument("stage: '" + q.name + "' is no ready device tensor");
    if (t.owner != ctx_.session)
      throw Unavailable("stage: '" + q.name + "' is not this node's allocator of record's (a takeover?); get it again");
    if (q.bytes == 0 || q.bytes > kChunk || q.at > t.bytes || q.bytes > t.bytes - q.at)
      throw InvalidArgument("stage: bytes [" + std::to_string(q.at) + ", +" + std::to_string(q.bytes) +
                            ") outside '" + q.name + "' or over the chunk of " + std::to_string(kChunk));
    auto [base, keep] = Process::get().cache().resolve(t.owner, t.alloc_id, []() -> std::unique_ptr<Mapping> {
      throw Unavailable("stage: the allocation is not this process's");
    });
    DeviceGuard g(t.device);
    if (!stream_ || stream_->device() != t.device) stream_.emplace(t.device);
    if (!t.event_handle.empty()) stream_wait_ipc_event(stream_->get(), t.event_handle);
    MEMCUDA_CUDA_TRY(cudaMemcpyAsync(ring_.get() + slot * kChunk, static_cast<const char*>(base) + t.offset + q.at,
                                     q.bytes, cudaMemcpyDeviceToHost, stream_->get()));
    MEMCUDA_CUDA_TRY(cudaStreamSynchronize(stream_->get()));
  }

  Context& ctx_;
  const std::string list_;
  PinnedBuffer ring_;
  transfer::Region region_;  // after ring_: unregistered before it is freed
  // The thread's alone:
  std::vector<Slot> slots_;
  std::deque<protocol::StageRequest> asks_;
  std::uint64_t tickets_ = 0;
  std::optional<UniqueStream> stream_;
  std::jthread thread_;  // last: stopped before the rest goes
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

#endif  // MEMCUDA_HAS_CUDA()
