// Boost.JSON compiled from source into the fuzz targets, with the same
// sanitizers and coverage instrumentation as they have (instead of linking
// the uninstrumented libboost_json).
#include <boost/json/src.hpp>

// memcuda::shape_from_string, which the shape and record decoders call, is
// defined in mem-cuda's implementation unit; the fuzzers need only this part
// of it (no Redis, no registry).
#include "memcuda/impl/shape.ipp"
