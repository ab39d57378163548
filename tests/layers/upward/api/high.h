/* A fixture for tools/check-layers (see util/low.c). Never compiled. */
