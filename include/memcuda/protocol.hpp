// The wire formats of the control plane (docs/protocol.md), one header each
// under memcuda/protocol/ (commands, replies, records, inbox messages, the
// session value, pool statistics), gathered here; json_util.hpp and
// limits.hpp hold the strict parsing and limits they share.
//
// Decoders face untrusted bytes: they are strict, bounded (size and nesting)
// and report every rejection as ProtocolError with a specific ProtocolErrc and
// a message naming the field and what was expected. They never crash and have
// no undefined behaviour on any input; the only other exception they may let
// through is std::bad_alloc. All JSON goes through Boost.JSON, and only the
// headers under memcuda/protocol/ include it.
#pragma once

#include "memcuda/protocol/command.hpp"
#include "memcuda/protocol/inbox.hpp"
#include "memcuda/protocol/json_util.hpp"
#include "memcuda/protocol/limits.hpp"
#include "memcuda/protocol/pool_stats.hpp"
#include "memcuda/protocol/record.hpp"
#include "memcuda/protocol/reply.hpp"
#include "memcuda/protocol/session.hpp"
