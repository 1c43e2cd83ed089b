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

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
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

  // Starts the thread, which makes the ring (pinned, exposed through `m`)
  // and then serves: pinning 256 MiB takes long where the driver is slow
  // (seconds under compute-sanitizer), and the control thread, which
  // must renew its lease, does not wait for it. `m` outlives the stager.
  Stager(Context& ctx, transfer::Mover& m) : ctx_(ctx), list_(ctx.keys.stage(node_scope(ctx.node))), slots_(kSlots) {
    thread_ = std::jthread([this, &m](std::stop_token st) {
      if (make_ring(m)) run(st);
    });
  }
  // Stops the thread (its pop returns within kPoll); no network I/O here.
  ~Stager() {
    thread_.request_stop();
    if (thread_.joinable()) thread_.join();
    if (served_)
      log(LogLevel::debug, "fleet stager: served " + std::to_string(served_) + " chunk(s) in " +
                               std::to_string(batches_) + " batch(es), busy " +
                               std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(busy_).count()) +
                               " ms");
  }
  Stager(const Stager&) = delete;
  Stager& operator=(const Stager&) = delete;

  // The ring's region once it is made (null before, and when it failed).
  const transfer::Region* region() const noexcept {
    return state_.load(std::memory_order_acquire) == State::ready ? &*region_ : nullptr;
  }
  // Why the ring could not be made (empty while it is made or being made).
  std::string failure() const {
    return state_.load(std::memory_order_acquire) == State::failed ? why_ : std::string();
  }

 private:
  struct Slot {
    std::uint64_t ticket = 0;  // 0: free
    std::chrono::steady_clock::time_point until;
  };
  enum class State { making, ready, failed };
  static constexpr std::chrono::milliseconds kPoll{200};

  bool make_ring(transfer::Mover& m) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      ring_.emplace(kSlots * kChunk);
      region_.emplace(m.expose(ring_->get(), ring_->bytes(), transfer::MemoryKind::host));
    } catch (const std::exception& e) {  // CudaError, Unavailable (the mover refused the ring)
      region_.reset();
      ring_.reset();
      why_ = e.what();
      state_.store(State::failed, std::memory_order_release);
      return false;
    }
    state_.store(State::ready, std::memory_order_release);
    log(LogLevel::debug, "fleet stager: ring of " + std::to_string(kSlots * kChunk >> 20) + " MiB made in " +
                             std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                std::chrono::steady_clock::now() - t0).count()) + " ms");
    return true;
  }
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
        if (!r.is_nil()) {
          take(r[1].str());
          // The rest waiting, in one round trip: a batch. (A Redis before
          // 6.2 has no count: the pops above take them one at a time.)
          redis::Reply more;
          try {
            if (asks_.size() < kMaxAsks)
              more = c->command({"LPOP", list_, std::to_string(std::min(kSlots * 4, kMaxAsks - asks_.size()))});
          } catch (const ReplyError&) {
          }
          for (std::size_t i = 0; i < more.size(); ++i) take(more[i].str());
        }
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

  // An ask being served: its slot, and its answer once it has one.
  struct Item {
    protocol::StageRequest q;
    std::size_t slot;
    std::string answer;    // set: an error, or the grant
    std::size_t read = 0;  // its record's reply, 1-based (0: none read)
  };

  // Serves the waiting asks while a slot is free (those whose lease passed
  // are free again), a batch at a time: the batch's records in one round
  // trip, its copies on one stream per device with one wait, its answers
  // in one round trip (a chunk alone costs three round trips and a wait,
  // which made one stager the limit of every node reading from it).
  void serve(redis::Connection& c) {
    const auto now = std::chrono::steady_clock::now();
    for (auto& s : slots_)
      if (s.ticket && now >= s.until) s.ticket = 0;
    while (!asks_.empty()) {
      std::vector<Item> batch = next_batch();
      if (batch.empty()) return;
      struct Busy {
        Stager& s;
        std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
        ~Busy() { s.busy_ += std::chrono::steady_clock::now() - t0; }
      } busy{*this};
      ++batches_;
      try {
        answer(c, batch, stage_batch(c, batch));
      } catch (const IoError&) {  // served again once Redis answers
        for (auto it = batch.rbegin(); it != batch.rend(); ++it) asks_.push_front(std::move(it->q));
        throw;
      }
    }
  }

  // The waiting asks, one per free slot (those whose reply list is not one
  // of this namespace's dropped).
  std::vector<Item> next_batch() {
    std::vector<Item> batch;
    for (std::size_t i = 0; i < slots_.size() && !asks_.empty(); ++i) {
      if (slots_[i].ticket) continue;
      while (!asks_.empty()) {
        protocol::StageRequest q = std::move(asks_.front());
        asks_.pop_front();
        if (q.reply_to.starts_with(ctx_.keys.reply(""))) {
          batch.push_back({std::move(q), i, {}});
          break;
        }
        log(LogLevel::warn, "fleet stager: dropped an ask whose reply list '" + q.reply_to.substr(0, 80) +
                                "' is not a reply list of this namespace");
      }
    }
    return batch;
  }

  // The batch's records read and its copies made: -> the items copied (the
  // others have their error answer).
  std::vector<Item*> stage_batch(redis::Connection& c, std::vector<Item>& batch) {
    std::vector<redis::Command> reads;
    for (auto& it : batch) {
      if (!is_valid_name(it.q.name)) {
        it.answer = error_answer(InvalidArgument("stage: '" + it.q.name.substr(0, 80) + "' is no tensor name"));
        continue;
      }
      reads.push_back(store::read_record_cmd(ctx_.keys.tensor(it.q.name)));
      it.read = reads.size();
    }
    std::vector<std::exception_ptr> errs;
    const std::vector<redis::Reply> recs = c.pipeline(reads, &errs);
    std::vector<Item*> staged;
    std::vector<std::shared_ptr<void>> keep;  // the mappings, until the copies are done
    for (auto& it : batch) {
      if (!it.read) continue;
      try {
        if (errs[it.read - 1]) std::rethrow_exception(errs[it.read - 1]);
        stage(it.q, recs[it.read - 1], it.slot, keep);
        staged.push_back(&it);
      } catch (const std::exception& e) {
        it.answer = error_answer(e);
      }
    }
    std::exception_ptr failed;  // every stream waited for before the mappings and slots go
    for (auto& [dev, st] : streams_) {
      try {
        MEMCUDA_CUDA_TRY(cudaStreamSynchronize(st.get()));
      } catch (const std::exception&) {
        if (!failed) failed = std::current_exception();
      }
    }
    if (failed) {
      try {
        std::rethrow_exception(failed);
      } catch (const std::exception& e) {
        for (Item* it : staged) it->answer = error_answer(e);
      }
      staged.clear();
    }
    return staged;
  }

  // The slots of `staged` granted, and every item's answer pushed.
  void answer(redis::Connection& c, std::vector<Item>& batch, const std::vector<Item*>& staged) {
    const auto granted = std::chrono::steady_clock::now();
    served_ += staged.size();
    for (Item* it : staged) {
      slots_[it->slot] = {next_ticket(), granted + kLease};
      it->answer = protocol::encode_grant(
          {it->slot, slots_[it->slot].ticket, it->slot * kChunk, static_cast<std::uint64_t>(kLease.count())});
    }
    std::vector<redis::Command> answers;
    for (auto& it : batch) {
      answers.push_back({"RPUSH", it.q.reply_to, it.answer});
      answers.push_back({"PEXPIRE", it.q.reply_to, "60000"});
    }
    // Redis failing here may have delivered some grants: their slots stay
    // taken until their leases pass (serve() asks again for the batch).
    std::vector<std::exception_ptr> errs;
    c.pipeline(answers, &errs);
    for (std::size_t k = 0; k < batch.size(); ++k)
      if (errs[2 * k]) {  // a reply key of another type: that asker's loss alone
        slots_[batch[k].slot].ticket = 0;
        try {
          std::rethrow_exception(errs[2 * k]);
        } catch (const std::exception& e) {
          log(LogLevel::warn, "fleet stager: answering on '" + batch[k].q.reply_to.substr(0, 80) + "': " + e.what());
        }
      }
  }

  static std::string error_answer(const std::exception& e) {
    return protocol::encode_reply(protocol::make_error_reply(nullptr, e));
  }

  // Tickets start at a random point per stager, so that an unstage left
  // over from an earlier stager of this session (a lease lost and won
  // back), or guessed, does not free a slot someone is reading.
  std::uint64_t next_ticket() {
    if (tickets_ == 0) tickets_ = (std::uint64_t{std::random_device{}()} << 32 | std::random_device{}()) | 1;
    return ++tickets_;
  }

  // Enqueues the copy of the asked bytes of a ready device tensor this
  // process owns (its record `r`) into slot `slot`, after the producer's
  // last published writes; serve() waits for it.
  void stage(const protocol::StageRequest& q, const redis::Reply& r, std::size_t slot,
             std::vector<std::shared_ptr<void>>& keep) {
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
    auto [base, mapping] = Process::get().cache().resolve(t.owner, t.alloc_id, []() -> std::unique_ptr<Mapping> {
      throw Unavailable("stage: the allocation is not this process's");
    });
    auto st = streams_.find(t.device);
    if (st == streams_.end()) st = streams_.emplace(t.device, UniqueStream(t.device)).first;
    DeviceGuard g(t.device);
    if (!t.event_handle.empty()) stream_wait_ipc_event(st->second.get(), t.event_handle);
    MEMCUDA_CUDA_TRY(cudaMemcpyAsync(ring_->get() + slot * kChunk, static_cast<const char*>(base) + t.offset + q.at,
                                     q.bytes, cudaMemcpyDeviceToHost, st->second.get()));
    keep.push_back(std::move(mapping));  // mapped until the copy is done
  }

  Context& ctx_;
  const std::string list_;
  std::atomic<State> state_{State::making};
  std::string why_;  // written before state_ says failed
  // Made by the thread before state_ says ready, then only read:
  std::optional<PinnedBuffer> ring_;
  std::optional<transfer::Region> region_;  // after ring_: unregistered before it is freed
  // The thread's alone:
  std::vector<Slot> slots_;
  std::deque<protocol::StageRequest> asks_;
  std::uint64_t tickets_ = 0;
  std::map<int, UniqueStream> streams_;  // a device's copies
  std::uint64_t served_ = 0, batches_ = 0;  // the debug log's
  std::chrono::steady_clock::duration busy_{};
  std::jthread thread_;  // last: stopped before the rest goes
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

#endif  // MEMCUDA_HAS_CUDA()
