/* pause: the infra ("sandbox") container of a pod for the local e2e cluster.
 *
 * Holds the pod's namespaces open and does nothing else: SIGINT/SIGTERM end it with status 0,
 * SIGCHLD reaps zombies (it is PID 1 of the pod when the pod shares a PID namespace), and
 * `pause -v` prints a version. Build: gcc -static -O2 -o pause pause.c
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define VERSION "cojob-e2e-pause 3.10"

static void on_term(int sig) {
  (void)sig;
  _exit(0);
}

static void on_chld(int sig) {
  (void)sig;
  int saved = errno;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
  errno = saved;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "-v") == 0) {
    puts(VERSION);
    return 0;
  }
  if (getpid() != 1) fprintf(stderr, "pause: warning: not running as PID 1\n");

  struct sigaction term = {0};
  term.sa_handler = on_term;
  sigemptyset(&term.sa_mask);
  if (sigaction(SIGINT, &term, NULL) < 0 || sigaction(SIGTERM, &term, NULL) < 0) {
    perror("pause: sigaction SIGINT/SIGTERM");
    return 1;
  }

  struct sigaction chld = {0};
  chld.sa_handler = on_chld;
  sigemptyset(&chld.sa_mask);
  chld.sa_flags = SA_NOCLDSTOP | SA_RESTART;
  if (sigaction(SIGCHLD, &chld, NULL) < 0) {
    perror("pause: sigaction SIGCHLD");
    return 2;
  }

  for (;;) pause();
  return 42; /* not reached */
}
