// Boost.JSON compiled from source into the fuzz targets, with the same
// sanitizers and coverage instrumentation as they have (instead of linking
// the uninstrumented libboost_json).
#include <boost/json/src.hpp>
