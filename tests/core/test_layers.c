// test_layers.c: common/'s folders stand on each other with no include
// running back up (tests/lib/layers.py, issue 36): the tree passes, and a
// copy of common/ with one include planted against each rule is refused
// with a line naming it.
#include "testutil.h"

static void test_the_tree_stands(void **state) {
    (void)state;
    char *out = NULL;
    int rc = test_run("python3 tests/lib/layers.py .", &out);
    if (rc != 0 || !strstr(out, "none running back up")) fail_msg("exit %d\n%s", rc, out);
    free(out);
}

// Each plant: a file, the include added to it, and the words the line must carry.
static void test_plants_are_refused(void **state) {
    (void)state;
    static const char *const plants[][3] = {
        {"training/report/step_meter.c", "trainer.h", "the trainer above its own folder"},
        {"training/ckpt/ckpt.c", "trainer.h", "a part must not know the whole"},
        {"device/device.c", "kernels_cuda.h", "the interface knows no backend"},
        {"comm/comm_nccl.c", "comm_mpi_ops.h", "the other backend's"},
        {"model/gpt.c", "../../04_zero3/zeropp.h", "a stage's file"},
    };
    for (size_t i = 0; i < sizeof plants / sizeof plants[0]; i++) {
        char root[64], cmd[1024], *out = NULL;
        assert_int_equal(test_make_dir(root, sizeof root, "layers"), 0);
        snprintf(cmd, sizeof cmd, "cp -r common %s/ && touch %s/common/comm/comm_mpi_ops.h && "
                 "echo '#include \"%s\"' >> %s/common/%s && python3 tests/lib/layers.py %s", root, root, plants[i][1],
                 root, plants[i][0], root);
        int rc = test_run(cmd, &out);
        if (rc != 1 || !strstr(out, plants[i][0]) || !strstr(out, plants[i][2]))
            fail_msg("%s into %s: exit %d, expected 1 and \"%s\"\n%s", plants[i][1], plants[i][0], rc, plants[i][2],
                     out);
        free(out);
        assert_int_equal(test_remove_dir(root), 0);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_tree_stands),
        cmocka_unit_test(test_plants_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
