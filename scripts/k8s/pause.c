/* The pod sandbox's process (as Kubernetes' build/pause): sleeps, reaps children, exits 0 on
 * SIGINT or SIGTERM. scripts/k8s.sh builds it static into the sandbox image containerd runs,
 * since registry.k8s.io's is not reachable here. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void down(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction d = {.sa_handler = down}, r = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  sigaction(SIGINT, &d, NULL);
  sigaction(SIGTERM, &d, NULL);
  sigaction(SIGCHLD, &r, NULL);
  for (;;) pause();
}
