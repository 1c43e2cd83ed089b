// shape_from_string (memcuda/shape.hpp): the only part of shape.hpp that
// needs Boost.JSON's parser, kept out of the header.
#pragma once

#include <boost/json/parse.hpp>
#include <boost/json/parse_options.hpp>
#include <boost/json/value.hpp>

#include "memcuda/shape.hpp"

MEMCUDA_NAMESPACE_BEGIN

Shape shape_from_string(std::string_view text) {
  boost::json::parse_options opt;
  opt.max_depth = 2;  // an array of scalars; deeper is wrong anyway
  boost::json::error_code ec;
  boost::json::value v = boost::json::parse(text, ec, {}, opt);
  if (ec == boost::json::error::extra_data)
    throw ProtocolError(
        ProtocolErrc::trailing_garbage,
        "shape \"" + detail::rules::printable(text) + "\": unexpected bytes after the JSON array");
  if (ec)
    throw ProtocolError(ProtocolErrc::bad_json, "shape \"" + detail::rules::printable(text) +
                                                    "\": not a JSON array (" + ec.message() + ")");
  return detail::rules::shape_from_json(v, "shape");
}

MEMCUDA_NAMESPACE_END  // namespace memcuda
