// Emulated: everything is in cuda_emu.h, which the harness includes first.
#pragma once
#include "cuda_emu.h"
