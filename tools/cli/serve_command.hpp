// `memcuda serve`: hosts the allocator of record in the foreground until
// SIGINT, SIGTERM or SIGHUP, announcing each change between allocator of record
// and follower, then gives the lease back. The one command that runs the
// registry's control thread (see memcuda_cli.cpp). Included by memcuda_cli.cpp
// inside its namespace, after status_commands.hpp (leader_line).
#pragma once

// ---- serve ----------------------------------------------------------------

void emit_line(const std::string& s) {
  std::cout << s << std::endl;  // flushed: someone may be waiting for this line
}

// Says whether this process is now the allocator of record or a follower.
void announce_role(Context& c, TensorRegistry& reg, bool leader) {
  LeaderInfo l;
  try {
    l = reg.leader();
  } catch (const RedisError&) {
    // Redis is away, or refuses our credentials for now (a password
    // rotation): the control thread keeps trying, and this process keeps
    // what it owns.
    l = {};
  }
  if (c.json) {
    json::object ev{{"event", leader ? "leader" : "follower"}};
    if (l.present) {
      ev["epoch"] = l.epoch;
      ev["leader_session"] = l.session;
    }
    print_json(ev);
    std::cout.flush();
    return;
  }
  if (leader)
    emit_line("allocator of record" + (l.present ? " (epoch " + std::to_string(l.epoch) + ")" : std::string()));
  else
    emit_line("follower (allocator of record: " + leader_line(l) + ")");
}

int cmd_serve(Context& c) {
  no_operands(c);
  RegistryOptions o = c.registry_options(true);
  o.default_backend = backend_option(c);
  if (auto ttl = c.args.get("--lease-ttl"))
    o.lease_ttl = std::chrono::milliseconds(parse_int_option("--lease-ttl", *ttl, 30, 24LL * 3600 * 1000));

  // Blocked before the registry starts its thread, which inherits the mask:
  // the signals then reach only sigtimedwait below, never a thread that
  // would die of them with the lease still held.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGHUP);
  if (int e = pthread_sigmask(SIG_BLOCK, &stop, nullptr); e != 0)
    throw std::system_error(e, std::generic_category(), "pthread_sigmask");
  // A closed stdout (`memcuda serve | head -1`) must not kill the allocator
  // of record: writes fail quietly instead, and it goes on serving.
  ::signal(SIGPIPE, SIG_IGN);

  std::optional<TensorRegistry> reg;
  reg.emplace(o);
  const std::string session = reg->session_id();
  if (c.json)
    print_json(json::object{{"event", "started"},
                            {"session", session},
                            {"pid", ::getpid()},
                            {"url", c.redis.describe()},
                            {"namespace", c.name_space},
                            {"lease_ttl_ms", o.lease_ttl.count()}});
  else
    emit_line("memcuda serve: session " + session + " (pid " + std::to_string(::getpid()) + ") on " + c.where() +
              ", lease ttl " + std::to_string(o.lease_ttl.count()) + " ms");
  std::cout.flush();

  bool leader = reg->is_leader();
  announce_role(c, *reg, leader);
  int sig = 0;
  for (;;) {
    timespec poll{0, 100'000'000};
    sig = sigtimedwait(&stop, nullptr, &poll);
    if (sig > 0) break;
    if (errno != EAGAIN && errno != EINTR) throw std::system_error(errno, std::generic_category(), "sigtimedwait");
    if (bool now = reg->is_leader(); now != leader) {
      leader = now;
      announce_role(c, *reg, leader);
    }
  }
  const std::string signame = sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP";
  if (!c.json) emit_line("received " + signame + ": releasing the lease and stopping");
  reg.reset();  // stops the control thread; the lease goes at once
  if (c.json) {
    print_json(json::object{{"event", "stopped"}, {"signal", signame}});
    std::cout.flush();
  } else {
    emit_line("stopped");
  }
  return kOk;
}
