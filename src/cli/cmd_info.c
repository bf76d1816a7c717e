// cmd_info.c: `dspec info FILE`: placeholder until the GGUF reader lands (issue #2).
#include "cli/cli.h"

#include <stdio.h>

int ds_cli_info(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "dspec info: not built yet\n");
    return 1;
}
