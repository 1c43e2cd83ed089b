// A second implementation unit in the same program: must not link.
#include "impl_unit_host.cpp"
