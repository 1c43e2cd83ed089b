// The wire formats of the control plane (docs/protocol.md), one header each
// under memcuda/protocol/:
//  - command.hpp: lifecycle commands, JSON documents LPUSHed on the List
//    `tensor_lifecycle` (decode_command / encode_command / peek_reply_route);
//  - reply.hpp: replies, JSON documents LPUSHed on the List named by a
//    command's reply_to (decode_reply / encode_reply / make_error_reply);
//  - record.hpp: tensor records, the fields of a tensor's Redis Hash
//    (decode_record / encode_record);
//  - inbox.hpp: messages on a registry's inbox List and migrate answers
//    (decode_inbox / encode_inbox / decode_migrate_answer / encode_migrate_answer);
//  - session.hpp: the value of `memcuda:session:<id>` (decode_session / encode_session);
//  - pool_stats.hpp: the leader's pools under `memcuda:pool_stats`
//    (decode_pool_stats / encode_pool_stats);
//  - json_util.hpp and limits.hpp: the strict parsing and limits they share.
//
// Decoders face untrusted bytes: they are strict, bounded (size and nesting)
// and report every rejection as ProtocolError with a specific ProtocolErrc and
// a message naming the field and what was expected. They never crash and have
// no undefined behaviour on any input; the only other exception they may let
// through is std::bad_alloc. All JSON goes through Boost.JSON, and only the
// headers under memcuda/protocol/ include it.
//
// This header only gathers them, so that code including it keeps compiling;
// a translation unit that needs one format can include just that header.
#pragma once

#include "memcuda/protocol/command.hpp"
#include "memcuda/protocol/inbox.hpp"
#include "memcuda/protocol/json_util.hpp"
#include "memcuda/protocol/limits.hpp"
#include "memcuda/protocol/pool_stats.hpp"
#include "memcuda/protocol/record.hpp"
#include "memcuda/protocol/reply.hpp"
#include "memcuda/protocol/session.hpp"
