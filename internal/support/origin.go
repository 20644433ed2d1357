package support

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/rs/cors"
)

// origins are the browser origins (SUPPORT_FORM_ORIGINS) whose pages may
// post the form from another origin, lower-cased as browsers send them.
type origins map[string]bool

func newOrigins(list []string) origins {
	o := origins{}
	for _, s := range list {
		if s = strings.ToLower(strings.TrimSpace(s)); s != "" {
			o[s] = true
		}
	}
	return o
}

// cors answers the preflight of a listed origin and adds
// Access-Control-Allow-Origin (that origin, never *) to its posts. Every
// other origin gets no CORS headers, so its scripts cannot post or read the
// answer. rs/cors rather than go-chi/cors: go-chi/cors answers a preflight
// 200 where browsers and the contract expect 204, and its last release
// trails rs/cors's fixes (a sorted allowed-headers set, one Vary value).
func (o origins) cors() *cors.Cors {
	return cors.New(cors.Options{
		// A function, not AllowedOrigins: an empty list there means "allow
		// all", and an entry with * would be read as a pattern.
		AllowOriginFunc: func(origin string) bool { return o[strings.ToLower(origin)] },
		AllowedMethods:  []string{http.MethodPost},
		AllowedHeaders:  []string{"Content-Type", headerIdemKey, "Accept"},
		MaxAge:          600,
	})
}

// allows reports whether a post may come from the page that sent r. With
// no origins configured, every page may. Otherwise the page's origin is
// read from Origin, or, when a browser leaves that out, from Referer: it
// must be listed, or be this service itself (the page GET /support serves).
// A post that names no page at all (curl, a server) is left to the rate
// limit: a browser always names the page, so such a post is no cross-site
// forgery.
func (o origins) allows(r *http.Request) bool {
	if len(o) == 0 {
		return true
	}
	origin := r.Header.Get("Origin")
	if _, sent := r.Header["Origin"]; !sent {
		ref := r.Header.Get("Referer")
		if ref == "" {
			return true
		}
		u, err := url.Parse(ref)
		if err != nil {
			return false
		}
		origin = u.Scheme + "://" + u.Host
	}
	if o[strings.ToLower(origin)] {
		return true
	}
	u, err := url.Parse(origin)
	return err == nil && u.Host != "" && strings.EqualFold(u.Host, r.Host)
}
