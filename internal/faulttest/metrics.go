package faulttest

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Metrics is one scrape of /metrics: every sample of the Prometheus text
// format, with its labels.
type Metrics []Sample

// Sample is one line of the text format: name{labels} value.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// ParseMetrics reads the Prometheus text exposition format. It reads only
// what client_golang writes: no timestamps, label values with the three
// standard escapes.
func ParseMetrics(r io.Reader) (Metrics, error) {
	var out Metrics
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s, err := parseSample(line)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

func parseSample(line string) (Sample, error) {
	s := Sample{Labels: map[string]string{}}
	rest := line
	if i := strings.IndexAny(rest, "{ "); i < 0 {
		return Sample{}, fmt.Errorf("metrics line %q: no value", line)
	} else {
		s.Name, rest = rest[:i], rest[i:]
	}
	if strings.HasPrefix(rest, "{") {
		rest = rest[1:]
		for !strings.HasPrefix(rest, "}") {
			eq := strings.Index(rest, `="`)
			if eq < 0 {
				return Sample{}, fmt.Errorf("metrics line %q: bad labels", line)
			}
			name := strings.TrimPrefix(rest[:eq], ",")
			rest = rest[eq+2:]
			var val strings.Builder
			for {
				if rest == "" {
					return Sample{}, fmt.Errorf("metrics line %q: unterminated label", line)
				}
				c := rest[0]
				rest = rest[1:]
				if c == '"' {
					break
				}
				if c == '\\' && rest != "" {
					switch rest[0] {
					case 'n':
						c = '\n'
					default:
						c = rest[0]
					}
					rest = rest[1:]
				}
				val.WriteByte(c)
			}
			s.Labels[name] = val.String()
			rest = strings.TrimPrefix(rest, ",")
		}
		rest = rest[1:]
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return Sample{}, fmt.Errorf("metrics line %q: no value", line)
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return Sample{}, fmt.Errorf("metrics line %q: %w", line, err)
	}
	s.Value = v
	return s, nil
}

// Sum adds up the samples called name whose labels include every pair in
// match (given as "label", "value", ...).
func (m Metrics) Sum(name string, match ...string) float64 {
	var sum float64
next:
	for _, s := range m {
		if s.Name != name {
			continue
		}
		for i := 0; i+1 < len(match); i += 2 {
			if s.Labels[match[i]] != match[i+1] {
				continue next
			}
		}
		sum += s.Value
	}
	return sum
}
