// The commands of the `memcuda` tool as the user sees them: each one's
// synopsis and help text, the options it declares (parse_args() rejects any
// other), and the help pages built from them. Kept side by side, so that a
// command's help and the options it accepts are changed in one place.
// Included by memcuda_cli.cpp inside its namespace.
#pragma once

struct CommandDoc {
  std::string_view name;
  std::string_view brief;  // the synopsis in the command list
  std::string_view synopsis;
  std::string_view summary;
  std::string_view details;
};

constexpr CommandDoc kDocs[] = {
    {"ls", "ls [PATTERN]", "memcuda ls [PATTERN]", "list tensors, sorted by name (PATTERN: a glob, default *)",
     "Columns: NAME BACKEND DTYPE SHAPE DEVICE BYTES REFS STATE AGE NODE, then a totals line.\n"
     "Quote the pattern so the shell does not expand it: memcuda ls 'layer.*'.\n"},
    {"info", "info NAME", "memcuda info NAME", "every field of one tensor, and its holders",
     "Holders that name a process (a session \"<pid>-<hex>\" or \"pid:<pid>\") are shown with\n"
     "their pid and whether that pid is alive on this machine.\n"},
    {"rm", "rm NAME... | --prefix P | --all", "memcuda rm NAME... | memcuda rm --prefix P | memcuda rm --all",
     "remove tensors by name or prefix, 1000 names per script (memory goes with the last holder)",
     "Exit code 2 when any name was not found; the others are still removed.\n"
     "  --prefix P   every tensor whose name starts with P (not empty: an unset shell\n"
     "               variable must not mean every tensor; that is --all)\n"
     "  --all        every tensor of the registry (namespace)\n"},
    {"get-many", "get-many NAME... | --prefix P | --glob G",
     "memcuda get-many NAME... | memcuda get-many --prefix P | memcuda get-many --glob G",
     "open many tensors in one round trip and report each (references dropped at exit)",
     "Takes a reference to every name at once, as a consumer opening a model does, maps each,\n"
     "prints one line per tensor (name, dtype, shape, size, backend, generation) and one per\n"
     "name that could not be opened, with its error code. Exit code 2 when a name was not\n"
     "found, 6 when one failed otherwise.\n"
     "  --prefix P   every tensor whose name starts with P\n"
     "  --glob G     every tensor whose name matches G (* ? [..] [!..]; quote it)\n"},
    {"create-many", "create-many NAME[=DT:DIMS]... [--dtype DT --shape DIMS]",
     "memcuda create-many NAME[=DT:DIMS]... [--dtype DT] [--shape DIMS] [--device N] [--backend host|cuda] "
     "[--no-persistent] [--timeout MS]",
     "create many tensors in one request, all or nothing",
     "One create_many command to the allocator of record: when one name is taken, none is\n"
     "created. Each operand is NAME (dtype and shape from --dtype and --shape) or\n"
     "NAME=DTYPE:DIMS (its own, e.g. w=f32:2,3; step=i64: for a scalar). Persistent unless\n"
     "--no-persistent, as for create; the other options are create's.\n"},
    {"gc", "gc", "memcuda gc", "collect garbage now: drop references of dead processes, report what was reclaimed",
     "Dead holders are expired registry sessions and JSON client pids that no longer exist on\n"
     "this machine. The allocator of record also does this every gc_interval on its own.\n"},
    {"quarantine", "quarantine [clear ID...|--all]", "memcuda quarantine [clear ID... | clear --all]",
     "list malformed records the allocator of record moved aside, or delete them",
     "A key of the wrong Redis type under a tensor's name, or a record whose fields do not\n"
     "parse, is moved aside by the allocator of record's garbage collection (its data kept,\n"
     "unchanged) so that it breaks nothing else. Without operands: the quarantined records,\n"
     "their ids and why. `clear ID...` deletes them for good; exit code 2 when an id was not\n"
     "quarantined.\n"
     "  --all   with clear: every quarantined record\n"},
    {"leader", "leader", "memcuda leader", "who holds the allocator-of-record lease",
     "Exit code 3 when nobody does (start one with `memcuda serve`).\n"},
    {"stats", "stats [--prometheus]", "memcuda stats [--prometheus]",
     "tensors and bytes per device, pools (with bytes adopted or copied by takeovers), sessions, queue",
     "  --prometheus   the same in the Prometheus text exposition format\n"},
    {"serve", "serve [--backend B] [--lease-ttl MS]", "memcuda serve [--backend host|cuda] [--lease-ttl MS]",
     "host the allocator of record in the foreground until SIGINT/SIGTERM",
     "Prints each change between allocator of record and follower. Tensors this process\n"
     "allocates live as long as it runs. With --json: one JSON object per line (event).\n"
     "  --backend host|cuda   default backend of this registry (default: cuda if a GPU is usable)\n"
     "  --lease-ttl MS        allocator-of-record lease time to live (default 1500)\n"},
    {"create", "create NAME --dtype DT --shape DIMS",
     "memcuda create NAME --dtype DT --shape DIMS [--device N] [--backend host|cuda] [--no-persistent] [--timeout MS]",
     "create a tensor through the allocator of record",
     "The tensor is persistent (it stays after this command exits, until `memcuda rm`) unless\n"
     "--no-persistent is given, in which case it is freed again as soon as the command exits.\n"
     "Needs a running allocator of record (`memcuda serve`); exit code 4 otherwise.\n"
     "  --dtype DT       bool u8 i8 i16 i32 i64 u16 u32 u64 f16 bf16 f32 f64 (or float32, int64...)\n"
     "  --shape DIMS     comma-separated dimensions: 2,3 (\"\" or [] for a scalar)\n"
     "  --device N       CUDA device ordinal (cuda backend)\n"
     "  --backend B      host or cuda (default: cuda if a GPU is usable, else host)\n"
     "  --persistent     the default, spelled out\n"
     "  --no-persistent  free the tensor when this command exits\n"
     "  --timeout MS     how long to wait for the allocator of record (default 5000)\n"},
    {"cat", "cat NAME [--head N]", "memcuda cat NAME [--head N]", "print the first N elements of a tensor (default 10)",
     "Elements are decoded per dtype; f16 and bf16 are shown as float.\n"
     "  --head N   how many elements, in row-major order (default 10)\n"},
    {"help", "help [COMMAND]", "memcuda help [COMMAND]", "this text, or the help of one command", ""},
};

const std::map<std::string, std::vector<OptionSpec>, std::less<>>& command_options() {
  // create-many takes create's options (and applies them to every entry)
  const std::vector<OptionSpec> create_options = {{"--dtype", true},    {"--shape", true},         {"--device", true},
                                                  {"--backend", true},  {"--persistent", false},   {"--no-persistent", false},
                                                  {"--timeout", true}};
  static const std::map<std::string, std::vector<OptionSpec>, std::less<>> m = {
      {"ls", {}},
      {"info", {}},
      {"rm", {{"--prefix", true}, {"--all", false}}},
      {"get-many", {{"--prefix", true}, {"--glob", true}}},
      {"create-many", create_options},
      {"gc", {}},
      {"quarantine", {{"--all", false}}},
      {"leader", {}},
      {"stats", {{"--prometheus", false}}},
      {"serve", {{"--backend", true}, {"--lease-ttl", true}}},
      {"create", create_options},
      {"cat", {{"--head", true}}},
      {"help", {}},
  };
  return m;
}

const CommandDoc* doc_of(std::string_view name) {
  for (const auto& d : kDocs)
    if (d.name == name) return &d;
  return nullptr;
}

constexpr std::string_view kExitCodes =
    "exit codes:\n"
    "  0  ok\n"
    "  1  usage error (unknown command or option, malformed name, dtype, shape or value)\n"
    "  2  not found (no tensor of that name)\n"
    "  3  no leader (`memcuda leader`: nobody holds the allocator-of-record lease)\n"
    "  4  no allocator of record answered, or Redis unreachable or timed out\n"
    "  5  Redis rejected the credentials\n"
    "  6  any other error\n";

constexpr std::string_view kGlobalHelp =
    "global options (every command):\n"
    "  --url URL        Redis: redis://[[user]:password@]host[:port][/db] or unix:///path.sock\n"
    "                   (default: $MEMCUDA_REDIS_URL, else redis://127.0.0.1:6379); the password\n"
    "                   is better in $MEMCUDA_REDIS_PASSWORD (and an ACL user in $MEMCUDA_REDIS_USER):\n"
    "                   a URL on the command line is visible to every user in ps\n"
    "  --namespace NS   registry namespace (every key prefixed \"NS:\"); default: none\n"
    "  --runtime-dir DIR  directory of the fd server sockets (default: $MEMCUDA_RUNTIME_DIR,\n"
    "                   else /tmp/memcuda-<uid>); processes sharing host or vmm memory use one\n"
    "  --allowed-uids LIST, --allowed-gids LIST\n"
    "                   peers served besides this uid and root, e.g. 1000,1001 (default:\n"
    "                   $MEMCUDA_ALLOWED_UIDS, $MEMCUDA_ALLOWED_GIDS, else none)\n"
    "  --json           machine-readable output: one JSON document on stdout\n"
    "  --help, -h       help\n"
    "  --version        the mem-cuda version\n";

std::string global_help() {
  std::string s =
      "memcuda - inspect and manage the mem-cuda tensor registry\n\n"
      "usage: memcuda [--url URL] [--namespace NS] [--json] COMMAND [ARGS]\n\ncommands:\n";
  std::size_t w = 0;
  for (const auto& d : kDocs) w = std::max(w, d.brief.size());
  for (const auto& d : kDocs)
    s += "  " + std::string(d.brief) + std::string(w - d.brief.size() + 2, ' ') + std::string(d.summary) + "\n";
  s += "\n" + std::string(kGlobalHelp) + "\n" + std::string(kExitCodes) +
       "\n`memcuda COMMAND --help` describes one command; docs/cli.md has examples.\n";
  return s;
}

std::string command_help(const CommandDoc& d) {
  return "usage: " + std::string(d.synopsis) + "\n\n" + std::string(d.summary) + "\n\n" + std::string(d.details) +
         (d.details.empty() ? "" : "\n") + std::string(kGlobalHelp) + "\n" + std::string(kExitCodes);
}
