// ecokv eval: benchmark metrics (placeholder, being written).
#pragma once
