package enrich

import (
	"flag"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestConfigFlags(t *testing.T) {
	var c Config
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	c.BindFlags(fs)
	if c.Source != SourceAuto || !c.EnableIPv6 || c.GracePeriod != DefaultGracePeriod || c.SyncTimeout != DefaultSyncTimeout {
		t.Fatalf("defaults after BindFlags: %+v", c)
	}
	err := fs.Parse([]string{"--k8s.inventory", "a.yaml,b.yaml", "--k8s.inventory=c.yaml", "--k8s.enable-ipv6=false",
		"--k8s.grace-period", "90s", "--k8s.service-cidrs", "198.19.0.0/16, fd00:10:96::/108", "--k8s.cluster-cidrs", "198.18.0.1/15",
		"--k8s.sync-timeout", "10s", "--k8s.context", "lab"})
	if err != nil {
		t.Fatal(err)
	}
	c.SetDefaults()
	if c.Source != SourceInventory || !slices.Equal(c.Inventory, []string{"a.yaml", "b.yaml", "c.yaml"}) || c.EnableIPv6 ||
		c.GracePeriod != 90*time.Second || c.SyncTimeout != 10*time.Second || c.Context != "lab" ||
		!slices.Equal(c.ServiceCIDRs, []netip.Prefix{netip.MustParsePrefix("198.19.0.0/16"), netip.MustParsePrefix("fd00:10:96::/108")}) ||
		!slices.Equal(c.ClusterCIDRs, []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")}) {
		t.Errorf("parsed %+v", c)
	}
	// IPv6 CIDR with IPv6 disabled.
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "fd00:10:96::/108") {
		t.Errorf("Validate: %v", err)
	}
	if err := fs.Parse([]string{"--k8s.service-cidrs", "198.18.0.0/33"}); err == nil {
		t.Error("bad CIDR accepted")
	}
}

func TestConfigSource(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     func(*Config)
		env     map[string]string
		want    Source
		wantErr string
	}{
		{"nothing: off", nil, nil, SourceOff, ""},
		{"inventory files", func(c *Config) { c.Inventory = []string{"x.yaml"} }, nil, SourceInventory, ""},
		{"kubeconfig flag", func(c *Config) { c.Kubeconfig = "/k" }, nil, SourceKubeconfig, ""},
		{"KUBECONFIG", nil, map[string]string{"KUBECONFIG": "/k"}, SourceKubeconfig, ""},
		{"in a pod", nil, map[string]string{"KUBERNETES_SERVICE_HOST": "198.19.0.1", "KUBERNETES_SERVICE_PORT": "443"}, SourceInCluster, ""},
		{"inventory wins over the pod", func(c *Config) { c.Inventory = []string{"x.yaml"} },
			map[string]string{"KUBERNETES_SERVICE_HOST": "fd00:10:96::1", "KUBERNETES_SERVICE_PORT": "443"}, SourceInventory, ""},
		{"explicit in-cluster with files", func(c *Config) { c.Source = SourceInCluster; c.Inventory = []string{"x"} }, nil, SourceInCluster, "only read by the inventory source"},
		{"inventory without files", func(c *Config) { c.Source = SourceInventory }, nil, SourceInventory, "needs --k8s.inventory"},
		{"inventory and kubeconfig", func(c *Config) { c.Inventory = []string{"x"}; c.Kubeconfig = "/k" }, nil, SourceInventory, "choose one"},
		{"unknown source", func(c *Config) { c.Source = "cloud" }, nil, "cloud", "want auto"},
		{"negative grace", func(c *Config) { c.GracePeriod = -time.Second }, nil, SourceOff, "grace-period"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{"KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"} {
				t.Setenv(k, tc.env[k])
			}
			c := NewConfig()
			if tc.cfg != nil {
				tc.cfg(&c)
			}
			c.SetDefaults()
			if c.Source != tc.want {
				t.Errorf("source %q, want %q", c.Source, tc.want)
			}
			err := c.Validate()
			if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("Validate: %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestNewOff(t *testing.T) {
	t.Setenv("KUBECONFIG", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, err := New(NewConfig(), nil, discard()); err != ErrDisabled {
		t.Errorf("New with no source: %v, want ErrDisabled", err)
	}
}

func TestNewKubeconfigError(t *testing.T) {
	c := NewConfig()
	c.Kubeconfig = t.TempDir() + "/missing"
	if _, err := New(c, nil, discard()); err == nil || !strings.Contains(err.Error(), "kubeconfig") {
		t.Errorf("New with a missing kubeconfig: %v", err)
	}
}
