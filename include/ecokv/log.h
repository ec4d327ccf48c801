// ecokv: logging hook. The library never prints; it hands lines to a callback (llama_log_set style).
#pragma once

namespace ecokv {

enum class log_level { debug, info, warn, error };

// Receives one formatted line (without trailing newline). user_data is passed through unchanged.
using log_callback = void (*)(log_level level, const char * text, void * user_data);

// Installs the callback; nullptr silences the library (the default).
void log_set(log_callback callback, void * user_data);

}  // namespace ecokv
