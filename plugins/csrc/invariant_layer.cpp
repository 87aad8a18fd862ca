// Whole decoder layers composed from the batch-invariant kernels of invariant.cpp (see invariant.h).
#include "invariant.h"
