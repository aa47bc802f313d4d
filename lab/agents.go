package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/lab/agent"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/lab/topology"
	"github.com/dualflow/dualflow/nsrun"
)

// agentReadyTimeout bounds how long Up waits for an agent process to listen.
const agentReadyTimeout = 5 * time.Second

// ServerConfig returns the agent server config of pod: every declared
// container port, served in the pod's namespace.
func (l *Lab) ServerConfig(p *corev1.Pod) agent.ServerConfig {
	cfg := agent.ServerConfig{Name: p.Namespace + "/" + p.Name, NetNS: l.PodNetNSPath(p), Logger: l.cfg.Logger}
	for _, cp := range manifest.Ports(p) {
		switch cp.Protocol {
		case corev1.ProtocolTCP:
			cfg.TCP = append(cfg.TCP, uint16(cp.ContainerPort))
		case corev1.ProtocolUDP:
			cfg.UDP = append(cfg.UDP, uint16(cp.ContainerPort))
		}
	}
	return cfg
}

func (l *Lab) startAgents() error {
	if l.cfg.AgentBinary != "" {
		return l.startAgentProcesses()
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.stop = cancel
	for i := range l.Manifest.Pods {
		srv, err := agent.Listen(l.ServerConfig(&l.Manifest.Pods[i]))
		if err != nil {
			return err
		}
		l.wg.Go(func() { srv.Serve(ctx) })
	}
	return nil
}

// startAgentProcesses starts `<bin> lab agent serve` in every pod, in
// parallel, and waits until each one listens (it writes a line to fd 3).
func (l *Lab) startAgentProcesses() error {
	for _, d := range []string{runDir, logDir} {
		if err := os.MkdirAll(filepath.Join(l.cfg.StateDir, d), 0o755); err != nil {
			return fmt.Errorf("state dir: %w", err)
		}
	}
	pods := l.Manifest.Pods
	return topology.Parallel(context.Background(), len(pods), func(i int) error {
		p := &pods[i]
		cfg := l.ServerConfig(p)
		args := []string{"lab", "agent", "serve", "--name", cfg.Name, "--ready-fd", "3",
			"--tcp", joinPorts(cfg.TCP), "--udp", joinPorts(cfg.UDP)}
		return l.spawn("pod-"+p.Namespace+"-"+p.Name, l.PodNetNSPath(p), args)
	})
}

func joinPorts(ps []uint16) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = strconv.Itoa(int(p))
	}
	return strings.Join(s, ",")
}

// spawn starts the agent binary with args in the namespace at netns (the
// caller's when empty), as a session leader that outlives this process,
// logging to log/<name>.log, with its pid in run/<name>.pid. It returns
// once the agent reported ready on fd 3.
func (l *Lab) spawn(name, netns string, args []string) error {
	logf, err := os.OpenFile(filepath.Join(l.cfg.StateDir, logDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("agent %s: log: %w", name, err)
	}
	defer logf.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("agent %s: pipe: %w", name, err)
	}
	defer r.Close()
	cmd := exec.Command(l.cfg.AgentBinary, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if netns != "" {
		err = nsrun.Start(netns, cmd)
	} else {
		err = cmd.Start()
	}
	w.Close()
	if err != nil {
		return fmt.Errorf("agent %s: start: %w", name, err)
	}
	pid := cmd.Process.Pid
	cmd.Process.Release() // the agent outlives us; Down kills it by pid
	if err := os.WriteFile(filepath.Join(l.cfg.StateDir, runDir, name+".pid"), []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
		return fmt.Errorf("agent %s: pid file: %w", name, err)
	}
	r.SetReadDeadline(time.Now().Add(agentReadyTimeout))
	buf := make([]byte, 64)
	n, err := r.Read(buf)
	if err != nil || !bytes.HasPrefix(buf[:n], []byte("ready")) {
		return fmt.Errorf("agent %s (pid %d) not ready, see %s: %w", name, pid, logf.Name(), errors.Join(err, errors.New(string(buf[:n]))))
	}
	return nil
}

func (l *Lab) startTraffic() error {
	if l.cfg.AgentBinary != "" {
		if err := l.writeState(); err != nil { // the process reads the manifest
			return err
		}
		// The generator only dials from inside pod namespaces, so it runs in
		// the lab's fabric namespace: never a process of the root namespace,
		// and a lab teardown that kills by namespace finds it even without
		// its pid file.
		return l.spawn("traffic", nsrun.Path(manifest.FabricNetNS(l.cfg.Prefix)), []string{"lab", "agent", "traffic", "--state-dir", l.cfg.StateDir,
			"--interval", l.cfg.TrafficInterval.String(), "--ready-fd", "3"})
	}
	g, err := agent.NewGenerator(agent.GeneratorConfig{Flows: l.DefaultFlows(), Interval: l.cfg.TrafficInterval, Logger: l.cfg.Logger})
	if err != nil {
		return err
	}
	l.gen = g
	ctx, cancel := context.WithCancel(context.Background())
	prev := l.stop
	l.stop = func() {
		cancel()
		if prev != nil {
			prev()
		}
	}
	l.wg.Go(func() { g.Run(ctx) })
	return nil
}

// killPidFiles kills the agents listed in stateDir/run/*.pid. A pid is
// only killed if its command line is a dualflow lab agent, so a stale pid
// file never hits an unrelated process.
func killPidFiles(stateDir string) error {
	files, _ := filepath.Glob(filepath.Join(stateDir, runDir, "*.pid"))
	var pids []int
	for _, f := range files {
		if pid, ok := topology.PidFile(f, "\x00lab\x00agent\x00"); ok {
			pids = append(pids, pid)
			syscall.Kill(pid, syscall.SIGTERM)
		}
	}
	topology.Reap(pids, 2*time.Second)
	return nil
}
