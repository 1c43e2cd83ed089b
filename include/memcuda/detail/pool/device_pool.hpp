// The allocator of record's pool for one device of one backend: slabs
// exported once, tensors suballocated from them by the BlockAllocator.
// Thread-safe (one mutex); only the allocator of record's process uses it.
#pragma once

#include "memcuda/config.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "memcuda/detail/backend/backend.hpp"
#include "memcuda/detail/backend/process_cache.hpp"
#include "memcuda/detail/base/checked.hpp"
#include "memcuda/detail/base/log.hpp"
#include "memcuda/detail/pool/block_allocator.hpp"
#include "memcuda/detail/process/process.hpp"
#include "memcuda/options.hpp"
#include "memcuda/stats.hpp"
#if MEMCUDA_HAS_CUDA()
#include "memcuda/detail/cuda/runtime.hpp"
#endif

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// A tensor's place in the pool: the slab (kept alive by this reference)
// and the block inside it.
struct PoolBlock {
  std::shared_ptr<ExportedBlock> slab;
  Block block;
  // In an allocation the OS made for this very call and that it hands out
  // zeroed (a new memfd): zero() has nothing to do.
  bool fresh = false;
};

class DevicePool {
 public:
  DevicePool(Backend& backend, int device, std::string tag, const PoolOptions& opts,
             std::atomic<std::uint64_t>& next_alloc_id)
      : backend_(backend),
        device_(device),
        tag_(std::move(tag)),
        opts_(opts),
        next_id_(next_alloc_id),
        blocks_(BlockAllocatorOptions{static_cast<std::size_t>(opts.alignment)}) {
    slab_bytes_ = backend.kind() == BackendKind::host ? opts_.host_slab_bytes : opts_.slab_bytes;
    if (slab_bytes_ == 0 || slab_bytes_ % opts_.alignment != 0)
      throw InvalidArgument("pool slab size must be a positive multiple of the alignment (" +
                            std::to_string(opts_.alignment) + ")");
    threshold_ = opts_.dedicated_threshold ? opts_.dedicated_threshold : slab_bytes_ / 2;
    auto it = opts_.device_budgets.find(device);
    budget_ = it != opts_.device_budgets.end() ? it->second : opts_.budget_bytes;
  }
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  // A block of at least `bytes`. Reuses free space, else adds a slab (or a
  // dedicated allocation for a large tensor). Throws BudgetExceeded when the
  // budget (after returning empty slabs) or the device cannot hold it.
  PoolBlock allocate(std::uint64_t bytes) {
    const std::uint64_t want = round_up(bytes == 0 ? 1 : bytes);
    std::vector<std::shared_ptr<ExportedBlock>> released;  // freed after unlocking
    std::lock_guard lk(mu_);
    if (want < threshold_) {
      if (auto b = blocks_.allocate(want)) return finish(*b, bytes);
    } else if (auto id = reusable_dedicated(want)) {
      if (auto b = blocks_.allocate_in(*id, want)) return finish(*b, bytes);
    }
    const std::uint64_t slab = want < threshold_ ? slab_bytes_ : want;
    make_room(slab, bytes, released);
    const std::uint64_t id = add_allocation(slab, want >= threshold_, released);
    auto b = blocks_.allocate_in(id, want);
    if (!b) throw InternalError("a fresh slab of " + std::to_string(slab) + " bytes could not hold " +
                                std::to_string(want));
    PoolBlock pb = finish(*b, bytes);
    pb.fresh = os_zeroed();
    return pb;
  }

  // Makes each block's first `bytes` (a new tensor's contents) read as
  // zeros before its record is published: a freed tensor's bytes are never
  // handed to the next creator. Runs outside the pool's lock; host: memset,
  // cuda: the pool's own stream, waited for. Skips fresh blocks (PoolBlock::fresh).
  void zero(const std::vector<std::pair<const PoolBlock*, std::uint64_t>>& blocks) {
    std::vector<std::pair<void*, std::uint64_t>> ranges;
    for (const auto& [pb, bytes] : blocks)
      if (!pb->fresh && bytes)
        ranges.emplace_back(static_cast<char*>(pb->slab->base()) + pb->block.offset, std::min(bytes, pb->block.size));
    if (backend_.kind() == BackendKind::host) {
      for (const auto& [p, n] : ranges) std::memset(p, 0, n);
      return;
    }
#if MEMCUDA_HAS_CUDA()
    zero_synchronously(ranges, zero_stream_);
#endif
  }

  // Places a whole batch (block sizes `sizes`, in order) in ONE allocation
  // sized to it: the sum of the aligned blocks, rounded up to the backend's
  // granularity, carved front to back. An importer then maps the batch with
  // one open instead of one per slab and dedicated tensor (an IPC open costs
  // 60-300 us; docs/design.md, "Fewer opens"). An empty packed or dedicated
  // allocation that fits the batch without wasting over a quarter is reused.
  // The allocation is a dedicated one: its freed space serves any later
  // block, and trim() returns it once empty.
  // nullopt, changing nothing, when packing is off, the batch is under
  // PoolOptions::pack_batches_min_bytes or has fewer than two blocks, or the
  // allocation cannot be had (the budget, or a full device): the caller
  // then places each block with allocate(). Throws what the backend throws
  // otherwise (CudaError), InvalidArgument on a size overflow.
  std::optional<std::vector<PoolBlock>> allocate_packed(const std::vector<std::uint64_t>& sizes) {
    if (opts_.pack_batches_min_bytes == 0 || sizes.size() < 2) return std::nullopt;
    std::vector<std::uint64_t> wants;
    wants.reserve(sizes.size());
    std::uint64_t total = 0;
    for (auto n : sizes) {
      wants.push_back(round_up(n == 0 ? 1 : n));
      total = checked_add(total, wants.back(), "batch size");
    }
    if (total < opts_.pack_batches_min_bytes) return std::nullopt;
    const std::uint64_t gran = granularity();
    const std::uint64_t size = checked_add(total, gran - 1, "batch size") / gran * gran;

    std::vector<std::shared_ptr<ExportedBlock>> released;  // freed after unlocking
    std::lock_guard lk(mu_);
    std::optional<std::uint64_t> id = reusable_dedicated(total);
    const bool added = !id;
    if (!id) {
      try {
        make_room(size, total, released);
        id = add_allocation(size, true, released);
      } catch (const BudgetExceeded& e) {
        log(LogLevel::info, std::string("pool: no single allocation for a batch of ") + std::to_string(sizes.size()) +
                                " tensors (" + e.what() + "); placing them one by one");
        return std::nullopt;
      }
    }
    std::vector<PoolBlock> out;
    out.reserve(sizes.size());
    const bool fresh = added && os_zeroed();
    std::uint64_t off = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      auto b = blocks_.allocate_at(*id, off, sizes[i] == 0 ? 1 : sizes[i]);
      if (!b) {
        for (std::size_t j = 0; j < out.size(); ++j) {  // leaves it empty: trim() returns it
          blocks_.deallocate(out[j].block);
          requested_ -= std::min(requested_, sizes[j]);
        }
        throw InternalError("pool: a packed allocation of " + std::to_string(blocks_.slab_size(*id)) +
                            " bytes could not hold block " + std::to_string(i) + " at offset " + std::to_string(off));
      }
      off += b->size;
      out.push_back(finish(*b, sizes[i]));
      out.back().fresh = fresh;
    }
    return out;
  }

  // Takes the allocation of a dead exporter that holds the tensors `ts`
  // (one allocation: same handle) into this pool without copying a byte,
  // and claims each tensor's block at its offset. The allocation is opened
  // once (Backend::adopt); a later call for the same handle claims more
  // blocks of it. Returns one block per tensor, nullopt where its range is
  // not free or not aligned to this pool (the caller falls back to a copy).
  // Its free space serves new tensors like any slab's; the budget is not
  // checked (the memory exists already). Throws what Backend::adopt throws
  // (Lost when the object is gone), Unavailable when the allocation's size
  // does not fit this pool's alignment.
  std::vector<std::optional<PoolBlock>> adopt(const std::vector<TensorInfo>& ts) {
    std::vector<std::optional<PoolBlock>> out(ts.size());
    if (ts.empty()) return out;
    std::lock_guard lk(mu_);
    const std::string& handle = ts.front().ipc_handle;
    std::uint64_t id = 0;
    if (auto it = adopted_.find(handle); it != adopted_.end()) {
      id = it->second;
    } else {
      id = next_id_.fetch_add(1);
      auto exported = std::make_shared<ExportedBlock>(backend_, backend_.adopt(ts.front(), id, tag_));
      const std::uint64_t size = exported->allocation().size;
      if (size == 0 || size % opts_.alignment != 0)
        throw Unavailable("allocation " + handle + " of " + std::to_string(size) +
                          " bytes does not fit this pool's alignment of " + std::to_string(opts_.alignment) +
                          " (its dead exporter ran with other pool options)");  // `exported` unmaps it
      blocks_.add_slab(id, size);
      slabs_.emplace(id, SlabEntry{exported, false, true});
      adopted_.emplace(handle, id);
      Process::get().cache().add_export(tag_, exported);
    }
    const auto& slab = slabs_.at(id).exported;
    for (std::size_t i = 0; i < ts.size(); ++i) {
      if (ts[i].ipc_handle != handle) continue;
      if (auto b = blocks_.allocate_at(id, ts[i].offset, ts[i].bytes)) {
        requested_ += ts[i].bytes;
        out[i] = PoolBlock{slab, *b, false};
      }
    }
    return out;
  }

  // The handles of the allocations this pool adopted and still holds, as
  // importers open them now (host: the pool's own link names).
  std::vector<std::string> adopted_handles() const {
    std::lock_guard lk(mu_);
    std::vector<std::string> v;
    for (const auto& [h, id] : adopted_) v.push_back(slabs_.at(id).exported->allocation().handle);
    return v;
  }

  // Counters of what a takeover saved: bytes of tensors adopted in place
  // and bytes copied into new memory (legacy CUDA IPC migration).
  void note_adopted(std::uint64_t bytes) noexcept { adopted_bytes_ += bytes; }
  void note_copied(std::uint64_t bytes) noexcept { copied_bytes_ += bytes; }

  // Gives a block back. Never frees device memory itself: empty slabs are
  // returned by trim(), which the control thread runs.
  void deallocate(const PoolBlock& pb) noexcept {
    try {
      if (opts_.poison) poison(pb.slab->base(), pb.block);
      std::lock_guard lk(mu_);
      blocks_.deallocate(pb.block);
      requested_ -= std::min(requested_, pb.block.size);
    } catch (const std::exception& e) {
      log(LogLevel::error, std::string("pool: ") + e.what());
    }
  }

  // Returns empty slabs to the driver: dedicated ones always, others beyond
  // retain_empty_slabs (all of them when `all`). Returns the bytes released.
  // The ids of the returned allocations are appended to `ids` when given
  // (importers are told to drop idle mappings of them).
  std::uint64_t trim(bool all = false, std::vector<std::uint64_t>* ids = nullptr) {
    std::vector<std::shared_ptr<ExportedBlock>> released;  // freed after unlocking
    std::lock_guard lk(mu_);
    auto n = trim_locked(all ? 0 : opts_.retain_empty_slabs, released);
    if (ids)
      for (const auto& b : released) ids->push_back(b->allocation().alloc_id);
    return n;
  }

  PoolStats stats() const {
    std::lock_guard lk(mu_);
    auto c = blocks_.counters();
    PoolStats s;
    s.backend = backend_.kind();
    s.device = device_;
#if MEMCUDA_HAS_CUDA()
    if (backend_.kind() == BackendKind::cuda) s.device_uuid = device_uuid(device_);
#endif
    s.in_use = c.in_use;
    s.reserved = c.reserved;
    s.peak_in_use = c.peak_in_use;
    s.budget = budget_;
    s.slabs = c.slabs;
    s.allocations = c.allocations;
    s.frees = c.frees;
    s.largest_free = c.largest_free;
    s.adopted_bytes = adopted_bytes_.load();
    s.copied_bytes = copied_bytes_.load();
    return s;
  }

  void reset_peak() {
    std::lock_guard lk(mu_);
    blocks_.reset_peak();
  }

  // Every slab now (kept alive by the copies).
  std::vector<std::shared_ptr<ExportedBlock>> slabs() const {
    std::lock_guard lk(mu_);
    std::vector<std::shared_ptr<ExportedBlock>> v;
    v.reserve(slabs_.size());
    for (const auto& [id, e] : slabs_) v.push_back(e.exported);
    return v;
  }

  // A graceful stop with a standby: every allocation whose memory can be
  // kept for the standby to adopt is marked (deallocate() then keeps its fd
  // served, see Allocation::retained). Returns how many allocations were retained.
  std::size_t retain_for_handover() {
    std::lock_guard lk(mu_);
    std::size_t n = 0;
    for (auto& [id, e] : slabs_)
      if (const auto& r = e.exported->allocation().retained) {
        r->store(true);
        ++n;
      }
    return n;
  }

 private:
  struct SlabEntry {
    std::shared_ptr<ExportedBlock> exported;
    bool dedicated;
    // Adopted from a dead exporter: released as soon as it is empty (never
    // kept idle), so that no object of a dead owner's naming outlives its
    // last tensor in this process for long.
    bool adopted = false;
  };

  // Allocates and exports `size` bytes as a new slab and returns its id. A
  // dedicated one (a large tensor's, a packed batch's) is returned by
  // trim() as soon as it is empty, whatever retain_empty_slabs says. When the device
  // (not our budget) is full, gives back what the pool keeps idle and tries
  // once more. Throws BudgetExceeded, CudaError. Lock held.
  std::uint64_t add_allocation(std::uint64_t size, bool dedicated,
                               std::vector<std::shared_ptr<ExportedBlock>>& released) {
    const std::uint64_t id = next_id_.fetch_add(1);
    std::shared_ptr<ExportedBlock> exported;
    try {
      exported = std::make_shared<ExportedBlock>(
          backend_, backend_.allocate(size, device_, id, tag_, opts_.upstream.get()));
    } catch (const BudgetExceeded&) {
      if (trim_locked(0, released) == 0) throw;
      released.clear();
      exported = std::make_shared<ExportedBlock>(
          backend_, backend_.allocate(size, device_, id, tag_, opts_.upstream.get()));
    }
    blocks_.add_slab(id, size);
    slabs_.emplace(id, SlabEntry{exported, dedicated});
    Process::get().cache().add_export(tag_, exported);
    return id;
  }

  // What a packed allocation is rounded up to: the driver's granularity for
  // cudaMalloc (2 MiB: a smaller tail would be wasted anyway), the page
  // size for shared memory; never below the pool's alignment.
  std::uint64_t granularity() const {
    std::uint64_t g = backend_.kind() == BackendKind::cuda ? (std::uint64_t{2} << 20) : page_size();
    return std::max<std::uint64_t>(g, opts_.alignment);
  }
  static std::uint64_t page_size() {
    const long p = ::sysconf(_SC_PAGESIZE);
    return p > 0 ? static_cast<std::uint64_t>(p) : 4096;
  }

  std::uint64_t round_up(std::uint64_t n) const {
    const std::uint64_t a = opts_.alignment;
    return checked_add(n, a - 1, "allocation size") / a * a;
  }

  // Whether a slab add_allocation() just made reads as zeros: a new memfd
  // object does (unless poison() filled it); device memory need not.
  bool os_zeroed() const noexcept { return backend_.kind() == BackendKind::host && !opts_.poison; }

  PoolBlock finish(const Block& b, std::uint64_t requested) {
    requested_ += requested;
    PoolBlock pb{slabs_.at(b.slab_id).exported, b, false};
    if (opts_.poison) poison(pb.slab->base(), b);
    return pb;
  }

  // Makes `slab` more bytes fit under the budget, returning empty slabs if
  // that helps; throws BudgetExceeded when it cannot.
  // An empty dedicated slab that fits `want` without wasting over a quarter.
  std::optional<std::uint64_t> reusable_dedicated(std::uint64_t want) const {
    std::optional<std::uint64_t> best;
    std::uint64_t best_size = 0;
    for (const auto& [id, e] : slabs_) {
      if (!e.dedicated || !blocks_.slab_empty(id)) continue;
      auto size = blocks_.slab_size(id);
      if (size >= want && size - want <= want / 4 && (!best || size < best_size)) {
        best = id;
        best_size = size;
      }
    }
    return best;
  }

  void make_room(std::uint64_t slab, std::uint64_t requested, std::vector<std::shared_ptr<ExportedBlock>>& released) {
    if (budget_ == 0) return;
    auto reserved = blocks_.counters().reserved;
    if (reserved + slab > budget_) trim_locked(0, released);
    reserved = blocks_.counters().reserved;
    if (reserved + slab > budget_)
      throw BudgetExceeded("allocating " + std::to_string(requested) + " bytes on " +
                           std::string(to_string(backend_.kind())) + " device " + std::to_string(device_) +
                           " would exceed its budget: in use " + std::to_string(blocks_.counters().in_use) +
                           ", reserved " + std::to_string(reserved) + ", needed " + std::to_string(slab) +
                           " more, budget " + std::to_string(budget_) + " bytes");
  }

  // Takes empty slabs out of the pool; the caller drops `out` after
  // unlocking, so the cudaFree/munmap happens outside the lock.
  std::uint64_t trim_locked(std::uint64_t keep, std::vector<std::shared_ptr<ExportedBlock>>& out) {
    std::uint64_t released = 0, kept = 0;
    for (auto id : blocks_.empty_slabs()) {
      auto it = slabs_.find(id);
      if (!it->second.dedicated && !it->second.adopted && kept < keep) {
        ++kept;
        continue;
      }
      released += blocks_.slab_size(id);
      blocks_.remove_slab(id);
      if (it->second.adopted) std::erase_if(adopted_, [&](const auto& e) { return e.second == id; });
      out.push_back(std::move(it->second.exported));
      slabs_.erase(it);  // memory goes with the last local user of the slab
    }
    return released;
  }

  void poison(void* base, const Block& b) const {
    char* p = static_cast<char*>(base) + b.offset;
    if (backend_.kind() == BackendKind::host) {
      std::memset(p, 0xDD, b.size);
      return;
    }
#if MEMCUDA_HAS_CUDA()
    DeviceGuard g(device_);
    MEMCUDA_CUDA_TRY(cudaMemset(p, 0xDD, b.size));
#endif
  }

  Backend& backend_;
  const int device_;
  const std::string tag_;
  const PoolOptions opts_;
  std::atomic<std::uint64_t>& next_id_;
  std::uint64_t slab_bytes_ = 0;
  std::uint64_t threshold_ = 0;
  std::uint64_t budget_ = 0;
  std::uint64_t requested_ = 0;
  mutable std::mutex mu_;
  BlockAllocator blocks_;
  std::unordered_map<std::uint64_t, SlabEntry> slabs_;
  // The dead owner's handle (the records' before adoption) -> slab id of adopted allocations
  std::unordered_map<std::string, std::uint64_t> adopted_;
  std::atomic<std::uint64_t> adopted_bytes_{0}, copied_bytes_{0};
#if MEMCUDA_HAS_CUDA()
  KeptStream zero_stream_{device_};  // zero(): one stream for the pool's life
#endif
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
