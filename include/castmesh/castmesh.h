// Everything a castmesh user needs: actors, refs, ports, futures, runtime.
#pragma once

#include "castmesh/actor.h"
#include "castmesh/address.h"
#include "castmesh/future.h"
#include "castmesh/message.h"
#include "castmesh/port.h"
#include "castmesh/ref.h"
#include "castmesh/runtime.h"
#include "castmesh/supervision.h"
