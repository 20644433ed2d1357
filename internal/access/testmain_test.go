package access_test

import (
	"os"
	"testing"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

// TestMain starts throwaway Postgres and Redis servers for the tests when
// TEST_DATABASE_URL or TEST_REDIS_URL is unset (dbtest.Run).
func TestMain(m *testing.M) { os.Exit(dbtest.Run(m)) }
