package policy

import (
	"testing"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/dualflow/dualflow/flow"
)

// TestExplain: a denial names its deciding policy, the rules that could
// have allowed the flow and the nearest of them with what it lacks, in
// each family; an allowed side has no explanation.
func TestExplain(t *testing.T) {
	apiSel := map[string]string{"app": "api"}
	for _, f := range fams {
		t.Run(f.name, func(t *testing.T) {
			v := "IPv4"
			if f.name == "ipv6" {
				v = "IPv6"
			}
			cases := []struct {
				name string
				pols []*networkingv1.NetworkPolicy
				fl   Flow
				d    Direction
				want string // "" : allowed, no explanation
			}{
				{
					name: "ipBlock of the other family only",
					pols: pols(
						ingress(netpol("back", "allow-metrics-other-family", apiSel), onPorts(from(block(f.other)), portNum(tcpP, 9090))),
						ingress(netpol("back", "default-deny", nil))),
					fl: Flow{Src: webPeer(f), Dst: apiPeer(f, ""), Proto: flow.ProtoTCP, DstPort: 9090},
					want: "ingress denied by back/default-deny, which isolates back/api: no ingress rule of back/allow-metrics-other-family allows " + v + " TCP/9090 from front/web; " +
						"nearest: back/allow-metrics-other-family rule 0 matches 9090/TCP but has no " + v + " ipBlock",
				},
				{
					name: "pure default deny",
					pols: pols(ingress(netpol("back", "default-deny", nil))),
					fl:   Flow{Src: webPeer(f), Dst: apiPeer(f, ""), Proto: flow.ProtoTCP, DstPort: 8080},
					want: "ingress denied by back/default-deny, which isolates back/api (ingress) and allows nothing",
				},
				{
					name: "peer admitted on other ports",
					pols: pols(ingress(netpol("back", "web-http", apiSel), onPorts(from(namespaces(labels("team", "web"))), portNum(tcpP, 8080), portNum(udpP, 53)))),
					fl:   Flow{Src: webPeer(f), Dst: apiPeer(f, ""), Proto: flow.ProtoTCP, DstPort: 9090},
					want: "ingress denied by back/web-http, which isolates back/api: no ingress rule of back/web-http allows " + v + " TCP/9090 from front/web; " +
						"nearest: back/web-http rule 0 admits the peer but only on 8080/TCP, 53/UDP",
				},
				{
					name: "pod selector of the policy's namespace only",
					pols: pols(ingress(netpol("back", "same-ns", apiSel), from(pods(labels("app", "web"))))),
					fl:   Flow{Src: webPeer(f), Dst: apiPeer(f, ""), Proto: flow.ProtoTCP, DstPort: 9090},
					want: "ingress denied by back/same-ns, which isolates back/api: no ingress rule of back/same-ns allows " + v + " TCP/9090 from front/web; " +
						"nearest: back/same-ns rule 0 matches every port but selects pods of namespace back only, not of front",
				},
				{
					name: "egress to an address in an except",
					pols: pols(egress(netpol("front", "out", map[string]string{"app": "web"}), to(block(f.block, f.exceptP)))),
					fl:   Flow{Src: webPeer(f), Dst: Peer{Addr: f.api}, Proto: flow.ProtoUDP, DstPort: 53},
					d:    Egress,
					want: "egress denied by front/out, which isolates front/web: no egress rule of front/out allows " + v + " UDP/53 to " + f.api.String() + "; " +
						"nearest: front/out rule 0 matches every port but " + f.api.String() + " is in an ipBlock's except",
				},
				{
					name: "allowed",
					pols: pols(ingress(netpol("back", "any", apiSel), from())),
					fl:   Flow{Src: webPeer(f), Dst: apiPeer(f, ""), Proto: flow.ProtoTCP, DstPort: 9090},
				},
			}
			for _, c := range cases {
				s := mustCompile(t, c.pols...)
				e, ok := s.Explain(c.d, &c.fl)
				subject, remote := "back/api", "front/web"
				if c.d == Egress {
					subject, remote = "front/web", c.fl.Dst.Addr.String()
				}
				switch {
				case c.want == "" && ok:
					t.Errorf("%s: explained an allowed flow: %s", c.name, e.String(subject, remote))
				case c.want != "" && !ok:
					t.Errorf("%s: no explanation", c.name)
				case ok && e.String(subject, remote) != c.want:
					t.Errorf("%s:\n got %s\nwant %s", c.name, e.String(subject, remote), c.want)
				}
			}
		})
	}
}
