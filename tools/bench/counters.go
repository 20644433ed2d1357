package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// counters is a set of named cumulative counters read before and after a
// measured run; the difference, divided by the run's requests, is the cost
// per delivery.
type counters map[string]float64

func (after counters) minus(before counters) counters {
	d := counters{}
	for k, v := range after {
		if dv := v - before[k]; dv != 0 {
			d[k] = dv
		}
	}
	return d
}

func (c counters) plus(d counters) counters {
	out := counters{}
	for k, v := range c {
		out[k] = v
	}
	for k, v := range d {
		out[k] += v
	}
	return out
}

func (c counters) perRequest(n int) counters {
	out := counters{}
	for k, v := range c {
		out[k] = v / float64(n)
	}
	return out
}

// sortedKeys lists keys by descending value.
func (c counters) sortedKeys() []string {
	keys := slices.Collect(maps.Keys(c))
	slices.SortFunc(keys, func(a, b string) int {
		if c[a] != c[b] {
			if c[a] > c[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	return keys
}

// redisCounters reads, in one INFO call, Redis's reply writes (one per
// round trip of an unpipelined client) and the calls of every command,
// including those a Lua script makes inside Redis.
func redisCounters(ctx context.Context, rdb *redis.Client) (counters, error) {
	info, err := rdb.Info(ctx, "stats", "commandstats").Result()
	if err != nil {
		return nil, fmt.Errorf("redis INFO: %w", err)
	}
	c := counters{}
	for line := range strings.SplitSeq(info, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch {
		case k == "total_writes_processed":
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return nil, fmt.Errorf("redis INFO %s: %w", line, err)
			}
			c["round trips"] = n
		case strings.HasPrefix(k, "cmdstat_"):
			calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
			n, err := strconv.ParseFloat(calls, 64)
			if err != nil {
				return nil, fmt.Errorf("redis INFO %s: %w", line, err)
			}
			c[strings.ToUpper(strings.TrimPrefix(k, "cmdstat_"))] = n
		}
	}
	return c, nil
}

// redisDelta is the difference of two redisCounters snapshots, leaving out
// the INFO calls that took them.
func redisDelta(before, after counters) counters {
	d := after.minus(before)
	delete(d, "INFO")
	if d["round trips"] > 0 {
		d["round trips"]-- // the reply to the first INFO
	}
	return d
}

// pgStatements reads pg_stat_statements calls per statement in database db,
// keyed by queryid with the statement's first words, from a connection to
// another database so that reading does not count.
func pgStatements(ctx context.Context, adminURL, db string) (counters, error) {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `
SELECT s.queryid, left(regexp_replace(s.query, '\s+', ' ', 'g'), 48), s.calls
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = $1`, db)
	if err != nil {
		return nil, fmt.Errorf("pg_stat_statements: %w", err)
	}
	c := counters{}
	for rows.Next() {
		var id int64
		var text string
		var calls int64
		if err := rows.Scan(&id, &text, &calls); err != nil {
			return nil, err
		}
		c[strings.TrimSpace(text)+" … #"+strconv.FormatInt(id, 16)] += float64(calls)
	}
	return c, rows.Err()
}

// serviceMetrics scrapes the Go runtime's allocation counters and the
// delivery counters from a /metrics endpoint.
func serviceMetrics(ctx context.Context, url string) (counters, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s answered %d", url, resp.StatusCode)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics keeps the samples of the allocation, GC and delivery
// counters from the Prometheus text
// format, keyed by the sample's name and labels as written.
func parseMetrics(r io.Reader) (counters, error) {
	want := []string{"go_memstats_alloc_bytes_total", "go_memstats_mallocs_total", "go_gc_duration_seconds_count", "webhook_deliveries_total"}
	c := counters{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, _, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		if !slices.Contains(want, name) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		c[line[:i]] = v
	}
	return c, sc.Err()
}

func (c counters) sum() float64 {
	var s float64
	for _, v := range c {
		s += v
	}
	return s
}
