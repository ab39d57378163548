/* A fixture for tools/check-layers: the bottom layer calling a function the top layer defines,
 * without including its header (test unit.layers_refuses_symbol). */
int layersFixtureHigh(void);

int layersFixtureLow(void) { return layersFixtureHigh() + 1; }
