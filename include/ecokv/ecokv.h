// ecokv: umbrella header of the core library (no engine dependency).
#pragma once

#include "ecokv/analysis.h"
#include "ecokv/capture.h"
#include "ecokv/compress.h"
#include "ecokv/error.h"
#include "ecokv/method.h"
#include "ecokv/options.h"
#include "ecokv/safetensors.h"
#include "ecokv/synth.h"
#include "ecokv/tensor.h"
