// test_lr_schedule.c: the cosine schedule of lr_at (optim.c): a linear
// warm-up to --lr, a cosine from it to lr x min_lr_frac at the horizon's
// last step, and that floor past the horizon, where a resumed run that asks
// for more steps than the saved run's schedule spans goes on.
#include "testutil.h"
#include "trainer.h"

static TrainConfig cosine(int steps, int warmup) {
    TrainConfig c;
    memset(&c, 0, sizeof c);
    c.lr_schedule = "cosine";
    c.lr = 1e-3;
    c.min_lr_frac = 0.1;
    c.steps = steps;
    c.warmup = warmup;
    return c;
}

static void assert_lr(const TrainConfig *c, long step, double want) {
    double got = lr_at(c, step);
    if (!test_close(got, want, 0, 1e-12))
        fail_msg("--steps %d --warmup %d --schedule-steps %d: step %ld (0-based) lr %.9g, expected %.9g", c->steps,
                 c->warmup, c->schedule_steps, step, got, want);
}

// The shape: warm-up (s+1)/W, the peak at the first step after it, the
// floor at the last, the cosine's midpoint halfway.
static void test_warmup_then_cosine(void **state) {
    (void)state;
    TrainConfig c = cosine(11, 2);  // decay over steps 2..10
    assert_lr(&c, 0, 0.5e-3);
    assert_lr(&c, 1, 1e-3);
    assert_lr(&c, 2, 1e-3);
    assert_lr(&c, 6, 1e-4 + 0.5 * 9e-4);
    assert_lr(&c, 10, 1e-4);
    assert_lr(&c, 30, 1e-4);
}

// Issue 39, item 8: --steps 3 with a warm-up of 2 leaves one step of decay,
// and lr_at answered the peak for every step after the warm-up: a run
// resumed to step 5 stayed at 1e-3. Past the horizon the rate is the floor,
// as for a longer schedule; so with a warm-up as long as the schedule.
static void test_short_decay_reaches_the_floor(void **state) {
    (void)state;
    TrainConfig c = cosine(5, 2);
    c.schedule_steps = 3;  // the saved run's horizon, kept by --resume
    assert_lr(&c, 2, 1e-3);
    assert_lr(&c, 3, 1e-4);
    assert_lr(&c, 4, 1e-4);
    c = cosine(5, 3);
    c.schedule_steps = 3;
    assert_lr(&c, 2, 1e-3);
    assert_lr(&c, 3, 1e-4);
    c = cosine(1, 0);  // one step, no warm-up: the decay's only step is the peak's
    assert_lr(&c, 0, 1e-3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_warmup_then_cosine),
        cmocka_unit_test(test_short_decay_reaches_the_floor),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
