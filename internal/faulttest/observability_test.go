package faulttest_test

// The alerting rules (deploy/prometheus/alerts.yaml) and the dashboard
// (deploy/grafana/munchable-webhooks.json) against the binary's own
// /metrics: a renamed or never-written metric would leave a panel empty
// and an alert silent, and a metric no panel reads goes unseen.
// Expressions are read with Prometheus' own PromQL parser and the scrape
// with its text-format parser.

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"
)

// repoRoot is the repository, seen from this package's directory.
const repoRoot = "../.."

func readRepoFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type alertRule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func alertRules(t *testing.T) []alertRule {
	t.Helper()
	var f struct {
		Groups []struct {
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(readRepoFile(t, "deploy/prometheus/alerts.yaml"), &f); err != nil {
		t.Fatalf("alerts.yaml: %v", err)
	}
	var rules []alertRule
	for _, g := range f.Groups {
		rules = append(rules, g.Rules...)
	}
	if len(rules) == 0 {
		t.Fatal("alerts.yaml has no rules")
	}
	return rules
}

// observabilityExprs returns every PromQL expression of the alerting rules
// and the dashboard, keyed by where it is.
func observabilityExprs(t *testing.T) map[string]string {
	t.Helper()
	exprs := dashboardExprs(t)
	for _, r := range alertRules(t) {
		exprs["alert "+r.Alert] = r.Expr
	}
	return exprs
}

// dashboardExprs returns every PromQL expression of the dashboard, keyed
// by its panel.
func dashboardExprs(t *testing.T) map[string]string {
	t.Helper()
	exprs := map[string]string{}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(readRepoFile(t, "deploy/grafana/munchable-webhooks.json"), &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q has no query", p.Title)
		}
		for i, tg := range p.Targets {
			exprs[fmt.Sprintf("panel %q #%d", p.Title, i+1)] = tg.Expr
		}
	}
	return exprs
}

// grafanaRanges are the dashboard's range variables, which Grafana fills
// in before Prometheus sees the query.
var grafanaRanges = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

// selectors parses a PromQL expression (the dashboard's range variables
// filled in) and returns its vector selectors.
func selectors(expr string) ([]*parser.VectorSelector, error) {
	e, err := parser.ParseExpr(grafanaRanges.Replace(expr))
	if err != nil {
		return nil, err
	}
	var out []*parser.VectorSelector
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			out = append(out, vs)
		}
		return nil
	})
	return out, nil
}

// scrape reads the service's /metrics into metric families by name.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	r, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(r.Body)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	if len(families) < 10 {
		t.Fatalf("scraped only %v", slices.Sorted(maps.Keys(families)))
	}
	return families
}

// family finds the exported family a series name belongs to: itself, or a
// histogram's or summary's _bucket, _sum or _count.
func family(families map[string]*dto.MetricFamily, name string) (*dto.MetricFamily, bool) {
	if f, ok := families[name]; ok {
		return f, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if f := families[base]; ok && f != nil && (f.GetType() == dto.MetricType_HISTOGRAM || f.GetType() == dto.MetricType_SUMMARY) {
			return f, true
		}
	}
	return nil, false
}

// hasBucket reports whether a histogram has a bucket with upper bound le.
func hasBucket(f *dto.MetricFamily, le string) bool {
	bound, err := strconv.ParseFloat(le, 64)
	if err != nil {
		return false
	}
	for _, m := range f.GetMetric() {
		for _, b := range m.GetHistogram().GetBucket() {
			if b.GetUpperBound() == bound {
				return true
			}
		}
	}
	return false
}

// Every metric the dashboard and the alerts read is one the service
// exports, and a bucket picked by its bound is one of the histogram's
// (with other buckets the selector matches nothing and the alert is mute).
// And the other way round: every metric the service exports, but the Go
// runtime's and the process's, has a panel, so a new one is not left off
// the dashboard. (One scrape for both: a rig starts Postgres, Redis and
// the binary.)
func TestDashboardAndAlertsUseExportedMetrics(t *testing.T) {
	t.Parallel()
	exprs := observabilityExprs(t)
	r := newRig(t)
	// With the forward on: the relay's series exist for its consumers.
	families := scrape(t, r.service(forwardEnv).URL()+"/metrics")
	t.Run("every exported metric has a panel", func(t *testing.T) {
		onDashboard := map[string]bool{}
		for where, expr := range dashboardExprs(t) {
			sels, err := selectors(expr)
			if err != nil {
				t.Fatalf("%s: %s: %v", where, expr, err)
			}
			for _, vs := range sels {
				if f, ok := family(families, vs.Name); ok {
					onDashboard[f.GetName()] = true
				}
			}
		}
		for _, name := range slices.Sorted(maps.Keys(families)) {
			if !onDashboard[name] && !strings.HasPrefix(name, "go_") && !strings.HasPrefix(name, "process_") {
				t.Errorf("no dashboard panel reads %s", name)
			}
		}
	})
	for _, where := range slices.Sorted(maps.Keys(exprs)) {
		t.Run(where, func(t *testing.T) {
			sels, err := selectors(exprs[where])
			if err != nil {
				t.Fatalf("%s: %v", exprs[where], err)
			}
			if len(sels) == 0 {
				t.Errorf("reads no metric: %s", exprs[where])
			}
			for _, vs := range sels {
				f, ok := family(families, vs.Name)
				if !ok {
					t.Errorf("reads %s, which the service does not export", vs.Name)
					continue
				}
				for _, m := range vs.LabelMatchers {
					if m.Name == "le" && m.Type == labels.MatchEqual && !hasBucket(f, m.Value) {
						t.Errorf("reads %s{le=%q}, which is not a bucket the service exports", vs.Name, m.Value)
					}
				}
			}
		})
	}
}

// The parser finds what the expressions name, and no function, keyword,
// label or duration.
func TestSelectors(t *testing.T) {
	t.Parallel()
	sels, err := selectors(`sum by (provider, le) (rate(a_seconds_bucket{le="30", x=~"a|b"}[$__rate_interval])) / on(provider) group_left count(b_total offset 1h) > 0.05 and c unless d_total{reason="no_redis"} * 2e3`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, vs := range sels {
		got = append(got, vs.Name)
	}
	if want := []string{"a_seconds_bucket", "b_total", "c", "d_total"}; !slices.Equal(got, want) {
		t.Errorf("selectors = %v, want %v", got, want)
	}
}

// githubAnchors returns the anchors GitHub gives a Markdown file's
// headings. (GitHub's rule, written out: no Markdown library implements
// GitHub's anchors exactly.)
func githubAnchors(markdown string) map[string]bool {
	anchors := map[string]bool{}
	drop := regexp.MustCompile(`[^\p{L}\p{N}\- _]`)
	for line := range strings.SplitSeq(markdown, "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		a := strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(h), ""), " ", "-")
		anchors[a] = true
	}
	return anchors
}

// Each alert has a severity, a summary and a runbook section that exists.
func TestAlertsHaveRunbooks(t *testing.T) {
	t.Parallel()
	const runbook = "https://github.com/munchable/munchable-webhooks/blob/main/docs/OPERATIONS.md#"
	anchors := githubAnchors(string(readRepoFile(t, "docs/OPERATIONS.md")))
	for _, r := range alertRules(t) {
		t.Run(r.Alert, func(t *testing.T) {
			if sev := r.Labels["severity"]; sev != "critical" && sev != "warning" && sev != "info" {
				t.Errorf("severity %q, want critical, warning or info", sev)
			}
			anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], runbook)
			if !ok || !anchors[anchor] {
				t.Errorf("runbook_url %q is not a section of docs/OPERATIONS.md", r.Annotations["runbook_url"])
			}
			if r.Annotations["summary"] == "" {
				t.Error("no summary")
			}
		})
	}
}
