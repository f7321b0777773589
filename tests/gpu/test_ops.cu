/* tests/gpu/test_ops.cu — runs the op case table (tests/gpu/op_cases.h): each
 * selected case's compare function runs the CUDA op and its gpu/ref
 * reference on fresh random inputs and prints one "ok <check>" or
 * "FAIL <check>: ..." line per output it compares.
 *
 * Usage: test_ops [-o OP] [-k SUBSTRING] [-l]
 *   -o OP         only the cases of op family OP (activation, concat, ...)
 *   -k SUBSTRING  only the cases whose name holds SUBSTRING
 *   -l            print the selected cases' names, one "case <name>" line
 *                 each, then their count per family, and run nothing (no
 *                 device needed)
 * A case's name is its family, its check, element type, layout, shape and
 * parameters (op_case_name); its inputs are seeded from that name, so a
 * filtered run draws the inputs the full run draws.
 *
 * Ends with one line per family ("test_ops <op>: N ok, M failed"), a FAIL
 * line for a fault the device reports after the last case, and the total
 * ("test_ops: N ok, M failed"); exits 1 on any failure, 2 on a bad option or
 * a filter that selects nothing, and 0 with "SKIPPED: no CUDA device" when
 * there is no GPU. All cases run in one process: a fault that leaves the
 * device unusable fails the cases after it, and -o or -k then runs the
 * family or case alone.
 */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

#include <map>
#include <string>

/* The selection: the cases of -o's family whose names hold -k's text. */
struct selection {
    const char *op = NULL;
    const char *key = NULL;
    int list = 0;
};

static int usage(const char *why)
{
    fprintf(stderr, "test_ops: %s\nusage: test_ops [-o OP] [-k SUBSTRING] [-l]\n", why);
    return 2;
}

/* FNV-1a of the case's name: its inputs' seed. */
static uint64_t name_seed(const std::string &name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char ch : name)
        h = (h ^ ch) * 0x100000001b3ull;
    return h;
}

int main(int argc, char **argv)
{
    selection sel;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-l"))
            sel.list = 1;
        else if (!strcmp(argv[i], "-o") && i + 1 < argc)
            sel.op = argv[++i];
        else if (!strcmp(argv[i], "-k") && i + 1 < argc)
            sel.key = argv[++i];
        else
            return usage("unknown option, or one without its value");
    }

    const std::vector<op_case> all = op_cases();
    std::vector<const op_case *> cases;
    std::vector<std::string> names;
    int family_known = !sel.op;
    for (const op_case &c : all) {
        family_known |= sel.op && !strcmp(sel.op, c.op);
        const std::string name = op_case_name(c);
        if ((sel.op && strcmp(sel.op, c.op)) || (sel.key && name.find(sel.key) == std::string::npos))
            continue;
        cases.push_back(&c);
        names.push_back(name);
    }
    if (!family_known)
        return usage("-o names no op family of the table (-l lists the cases)");
    if (cases.empty())
        return usage("no case matches the filter");

    if (sel.list) {
        std::map<std::string, int> per_op;
        for (size_t i = 0; i < cases.size(); i++) {
            printf("case %s\n", names[i].c_str());
            per_op[cases[i]->op]++;
        }
        for (const auto &kv : per_op)
            printf("test_ops %s: %d cases\n", kv.first.c_str(), kv.second);
        printf("test_ops: %zu cases\n", cases.size());
        return 0;
    }

    if (skip_without_device())
        return 0;
    op_env env;
    env.s = test_stream();
    env.dnn = test_cudnn(env.s);
    env.ws_bytes = (size_t)32 << 20;
    env.ws = dalloc<char>(env.ws_bytes);
    if (cublasCreate(&env.blas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(env.blas, env.s) != CUBLAS_STATUS_SUCCESS ||
        cublasSetWorkspace(env.blas, env.ws, env.ws_bytes) != CUBLAS_STATUS_SUCCESS ||
        cublasLtCreate(&env.lt) != CUBLAS_STATUS_SUCCESS) {
        printf("FAIL setup: cuBLAS or cuBLASLt handle\n");
        return 1;
    }
    std::map<std::string, std::pair<int, int>> per_op; /* ok, failed */
    for (size_t i = 0; i < cases.size(); i++) {
        const int ok0 = g_ok, fail0 = g_fail;
        g_seed = name_seed(names[i]);
        cases[i]->run(*cases[i], env);
        auto &n = per_op[cases[i]->op];
        n.first += g_ok - ok0;
        n.second += g_fail - fail0;
    }
    for (const auto &kv : per_op)
        printf("test_ops %s: %d ok, %d failed\n", kv.first.c_str(), kv.second.first, kv.second.second);
    cublasLtDestroy(env.lt);
    cublasDestroy(env.blas);
    cudaFree(env.ws);
    cudnnDestroy(env.dnn);
    return finish("test_ops");
}
