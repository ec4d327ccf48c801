// Reproducer (docs/gpu.md), llama.cpp's API only: a context with an eval callback decodes a prompt, is reserved again
// (llama_set_causal_attn toggled: sched_need_reserve), and decodes again. With ggml-vulkan 0.5.0 on Mesa 22.3's
// lavapipe and every layer offloaded, memory is corrupted (glibc aborts, or lavapipe's queue thread crashes); without
// the callback, or without the second reserve (NO_RESERVE=1), it runs clean. The cause is lavapipe reading descriptor
// bindings left by earlier dispatches (patches/llama.cpp/0003-vulkan-write-every-binding.patch); with the patch it
// runs clean. test-adapter's a_context_reserved_again_after_its_callback_ran... runs the pattern 200 times.
//   g++ -std=c++17 tests/gpu/reserve-after-callback.cpp -Ithird_party/llama.cpp/include \
//       -Ithird_party/llama.cpp/ggml/include -Lbuild-vulkan/bin -lllama -lggml -lggml-base \
//       -Wl,-rpath,$PWD/build-vulkan/bin -o /tmp/reserve-after-callback
//   GGML_VK_VISIBLE_DEVICES=0 /tmp/reserve-after-callback models/stories260K.gguf 99 cb
#include <llama.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cstring>
#include <ggml-backend.h>
static bool cb(ggml_tensor * t, bool ask, void *) {
    if (ask) return strncmp(t->name, "Qcur-", 5) == 0 && t->op == GGML_OP_ROPE;
    std::vector<float> buf(ggml_nelements(t)); ggml_backend_tensor_get(t, buf.data(), 0, ggml_nbytes(t)); return true;
}
int main(int argc, char ** argv) {
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = atoi(argv[2]);
    llama_model * m = llama_model_load_from_file(argv[1], mp);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 512; cp.n_batch = 512;
    if (argc > 3) { cp.cb_eval = cb; }
    llama_context * ctx = llama_init_from_model(m, cp);
    std::vector<llama_token> toks(400);
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = 1 + (i * 7) % 500;
    llama_batch b = llama_batch_get_one(toks.data(), toks.size());
    printf("decode 1: %d\n", llama_decode(ctx, b));
    for (int r = 0; r < 5; ++r) {
        if (!getenv("NO_RESERVE")) llama_set_causal_attn(ctx, r % 2 == 0);  // sched_need_reserve
        llama_set_causal_attn(ctx, true);
        llama_token t = 5 + r;
        llama_batch b1 = llama_batch_get_one(&t, 1);
        printf("decode %d: %d\n", r + 2, llama_decode(ctx, b1));
    }
    llama_free(ctx);
    llama_model_free(m);
    printf("ok\n");
}
