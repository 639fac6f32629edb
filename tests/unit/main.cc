// The unit and transport tests' main(): Catch2 2's (CATCH_CONFIG_MAIN) or 3's session.
#define CATCH_CONFIG_MAIN
#include "tests/catch.h"

#if CATCH_VERSION_MAJOR >= 3
int main(int argc, char** argv) { return Catch::Session().run(argc, argv); }
#endif
