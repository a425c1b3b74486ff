-- The dashboard's sign-in state, shared by every `vidpoll serve` of a database (so several of
-- them behind one proxy agree on sessions):
-- * the salt its cookie-signing key is derived with (scrypt of the token and this salt,
--   vidpoll.web.dashboard): a leaked cookie alone allows no offline guess of the token. One
--   row, written by the first `serve` with a token (never here: a database created from a
--   template or restored from a dump would share a salt made by a migration);
-- * one row per signed-in session, by the SHA-256 of the session id its cookie carries (never
--   the id): logging out deletes it, so a copied cookie stops working at once.
-- Code of level 12 never reads either table.
-- vidpoll: expand
-- vidpoll: step
CREATE TABLE IF NOT EXISTS vidpoll_dashboard_salt (
  one        boolean PRIMARY KEY DEFAULT true CHECK (one),
  salt       bytea NOT NULL CHECK (length(salt) >= 16),
  created_at timestamptz NOT NULL DEFAULT now()
);
-- vidpoll: step
CREATE TABLE IF NOT EXISTS vidpoll_dashboard_sessions (
  digest     bytea PRIMARY KEY,
  created_at timestamptz NOT NULL DEFAULT now(),
  expires_at timestamptz NOT NULL
);
