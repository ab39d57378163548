/* A fixture for tools/check-layers: the bottom layer including the top one, which the check
 * must refuse (test unit.layers_refuses). Never compiled. */
#include "api/high.h"
