/* A fixture for tools/check-layers (see util/low_call.c). */
int layersFixtureHigh(void);

int layersFixtureHigh(void) { return 1; }
