// memcuda_bench_publish: the host memory a producer needs to publish a model
// from a file, in pieces through a bounded staging buffer
// (safetensors_entries + PublishOptions::staging_bytes) beside the baseline
// that reads the file whole into memory first (what loading a checkpoint to
// CPU and then publishing it does). Each publish runs in a fresh process of
// its own, so its peak RSS (VmHWM) and its sampled peak of anonymous memory
// are its alone; the model's size is the yardstick.
//
//   memcuda_bench_publish --backend cuda --gb 4 --staging-mb 64 [--tensors 64] [--dir /tmp] [--reps 2]
//
// Prints one JSON line per run and a table: rows publish_pieces_<backend>
// and publish_whole_<backend>; peak memory as a fraction of the model.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <iostream>
#include <thread>

#include "bench_common.hpp"
#include "memcuda/implementation.hpp"
#include "memcuda/memcuda.hpp"

namespace mb = memcuda::bench;
namespace json = boost::json;
using memcuda::DType;

namespace {

// A field of /proc/self/status in bytes ("VmHWM", "RssAnon"...).
std::uint64_t status_bytes(const std::string& field) {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1)) * 1024;
  return 0;
}

// Writes a safetensors file of `tensors` f32 tensors, `bytes` in all.
void write_model(const std::string& path, std::uint64_t bytes, int tensors) {
  const std::uint64_t each = (bytes / tensors) / 4 * 4;
  std::string header = "{";
  for (int i = 0; i < tensors; ++i) {
    header += std::string(i ? "," : "") + "\"layers." + std::to_string(i) + ".weight\":{\"dtype\":\"F32\",\"shape\":[" +
              std::to_string(each / 4) + "],\"data_offsets\":[" + std::to_string(i * each) + "," +
              std::to_string((i + 1) * each) + "]}";
  }
  header += "}";
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>((n >> (8 * i)) & 0xff));
  f << header;
  std::vector<float> block(1 << 20);
  for (std::size_t i = 0; i < block.size(); ++i) block[i] = static_cast<float>(i % 1000);
  for (std::uint64_t left = each * tensors; left > 0;) {
    const std::uint64_t n2 = std::min<std::uint64_t>(left, block.size() * 4);
    f.write(reinterpret_cast<const char*>(block.data()), static_cast<std::streamsize>(n2));
    left -= n2;
  }
  if (!f) throw std::runtime_error("writing " + path + " failed");
}

// One publish in this (fresh) process; prints its JSON line.
int child(const mb::Args& args) {
  const std::string mode = args.get_or("--child", "");
  const std::string path = args.get_or("--file", "");
  memcuda::RegistryOptions o = memcuda::RegistryOptions::from_env();
  o.redis = memcuda::redis::parse_url(args.get_or("--url", ""));
  o.name_space = args.get_or("--ns", "bench-publish");
  o.default_backend = args.get_or("--backend", "host") == "cuda" ? memcuda::BackendKind::cuda
                                                                   : memcuda::BackendKind::host;
  memcuda::TensorRegistry reg(o);
  auto entries = memcuda::safetensors_entries(path);
  std::uint64_t model = 0;
  for (const auto& e : entries) model += memcuda::itemsize(e.dtype) * static_cast<std::uint64_t>(e.shape[0]);
  // Warm the backend (a CUDA context's memory is not the publish's).
  { auto warm = reg.create<float>("warm", {1}); }
  const std::uint64_t anon0 = status_bytes("RssAnon"), rss0 = status_bytes("VmRSS");
  std::atomic<bool> done{false};
  std::atomic<std::uint64_t> anon_peak{anon0};
  std::thread sampler([&] {
    while (!done.load()) {
      anon_peak.store(std::max(anon_peak.load(), status_bytes("RssAnon")));
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  memcuda::PublishOptions po;
  po.staging_bytes = std::stoull(args.get_or("--staging-mb", "64")) << 20;
  std::vector<char> whole;
  const auto t0 = std::chrono::steady_clock::now();
  if (mode == "whole") {
    whole.resize(std::filesystem::file_size(path));
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    for (std::size_t off = 0; off < whole.size();) {
      ssize_t n = ::pread(fd, whole.data() + off, whole.size() - off, static_cast<off_t>(off));
      if (n <= 0) throw std::runtime_error("reading " + path + " failed");
      off += static_cast<std::size_t>(n);
    }
    ::close(fd);
    // The data offsets of write_model: each tensor after the last, after the header.
    std::uint64_t hlen = 0;
    for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | static_cast<unsigned char>(whole[i]);
    std::uint64_t off = 8 + hlen;
    for (auto& e : entries) {
      e.data = whole.data() + off;
      e.read = nullptr;
      off += memcuda::itemsize(e.dtype) * static_cast<std::uint64_t>(e.shape[0]);
    }
  }
  auto sd = memcuda::publish_state_dict(reg, "model/", entries, po);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  done = true;
  sampler.join();
  json::object r;
  r["mode"] = mode;
  r["model_bytes"] = model;
  r["seconds"] = secs;
  r["gb_per_s"] = static_cast<double>(model) / secs / 1e9;
  r["anon_peak_delta"] = anon_peak.load() - anon0;
  r["hwm_delta"] = status_bytes("VmHWM") > rss0 ? status_bytes("VmHWM") - rss0 : 0;
  r["staging_bytes"] = po.staging_bytes;
  std::cout << json::serialize(r) << std::endl;
  sd.clear();
  (void)reg.remove_prefix("model/");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  mb::Args args(argc, argv);
  try {
    if (args.get("--child")) return child(args);
    const std::string backend = args.get_or("--backend", "host");
    const double gb = std::stod(args.get_or("--gb", "1"));
    const int tensors = std::stoi(args.get_or("--tensors", "64"));
    const int reps = std::stoi(args.get_or("--reps", "2"));
    const std::string staging = args.get_or("--staging-mb", "64");
    const std::string path = args.get_or("--dir", "/tmp") + "/memcuda-bench-publish-" + std::to_string(::getpid()) +
                             ".safetensors";
    mb::RedisTarget redis(args);
    std::cerr << "writing a " << gb << " GB model of " << tensors << " tensors to " << path << "\n";
    write_model(path, static_cast<std::uint64_t>(gb * 1e9), tensors);
    std::vector<json::object> rows;
    for (int rep = 0; rep < reps; ++rep) {
      for (std::string mode : {"pieces", "whole"}) {  // alternating, in one run
        auto out = mb::capture({mb::self_exe().string(), "--child", mode, "--file", path, "--url", redis.url(),
                                "--backend", backend, "--staging-mb", staging, "--ns",
                                "bench-publish-" + std::to_string(::getpid())},
                               std::chrono::minutes(10));
        if (!out) throw std::runtime_error("the " + mode + " publish failed");
        std::cout << *out << std::flush;
        rows.push_back(json::parse(*out).as_object());
      }
    }
    std::filesystem::remove(path);
    std::cout << "\n| row | model GB | staging MiB | peak anon / model | peak RSS / model | GB/s |\n"
              << "| --- | ---: | ---: | ---: | ---: | ---: |\n";
    for (const auto& r : rows) {
      const double model = r.at("model_bytes").to_number<double>();
      std::cout << "| publish_" << r.at("mode").as_string().c_str() << "_" << backend << " | " << mb::fmt(model / 1e9, 2)
                << " | " << staging << " | " << mb::fmt(r.at("anon_peak_delta").to_number<double>() / model, 3)
                << " | " << mb::fmt(r.at("hwm_delta").to_number<double>() / model, 3) << " | "
                << mb::fmt(r.at("gb_per_s").to_number<double>(), 2) << " |\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "memcuda_bench_publish: " << e.what() << "\n";
    return 1;
  }
}
