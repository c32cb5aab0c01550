//! The cluster: etcd, the members, faults, and cleanup. See the [module documentation](super).

use super::*;

/// One Patroni member.
pub struct Member {
    pub name: String,
    pub api_port: u16,
    pub pg_port: u16,
    dir: PathBuf,
    data_dir: PathBuf,
    config_path: PathBuf,
    log_path: PathBuf,
    patroni: Option<Child>,
}

impl Member {
    pub fn host(&self) -> HostPort {
        HostPort { name: self.name.clone(), port: self.pg_port }
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The member's log: Patroni's output and its PostgreSQL's (`logging_collector` off).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    pub fn log_contents(&self) -> String {
        fs::read(&self.log_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// libpq connection string of this member alone.
    pub fn conninfo(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=2",
            self.pg_port
        )
    }

    /// `GET <path>` on the member's REST API: the status, or None if it does not answer in 1 s.
    pub fn api_status(&self, path: &str) -> Option<u16> {
        http(self.api_port, "GET", path, Duration::from_secs(1)).ok().map(|(s, _)| s)
    }

    /// `GET /patroni` body, if Patroni answers.
    pub fn api_patroni(&self) -> Option<String> {
        http(self.api_port, "GET", "/patroni", Duration::from_secs(1)).ok().map(|(_, b)| b)
    }

    /// Holds the leader key and runs as primary (`GET /primary` is 200).
    pub fn is_leader(&self) -> bool {
        self.api_status("/primary") == Some(200)
    }

    /// A running replica that is the synchronous standby (`GET /sync` is 200).
    pub fn is_sync_standby(&self) -> bool {
        self.api_status("/sync") == Some(200)
    }

    /// A running replica (`GET /replica` is 200).
    pub fn is_replica(&self) -> bool {
        self.api_status("/replica") == Some(200)
    }

    /// Pid of the postmaster of this member's data directory, if one runs.
    pub fn postmaster_pid(&self) -> Option<i32> {
        let text = fs::read_to_string(self.data_dir.join("postmaster.pid")).ok()?;
        let pid: i32 = text.lines().next()?.trim().parse().ok()?;
        (!is_gone(pid) && cmdline(pid).contains(&*self.data_dir.to_string_lossy())).then_some(pid)
    }

    pub fn patroni_pid(&self) -> Option<i32> {
        self.patroni.as_ref().map(|c| c.id() as i32)
    }

    /// Every live process of this member: Patroni, processes naming the data directory
    /// (postmaster, single-user postgres, pg_rewind, pg_basebackup...), and their descendants.
    fn processes(&self) -> Vec<i32> {
        let dd = self.data_dir.to_string_lossy().into_owned();
        let mut roots: Vec<i32> = self.patroni_pid().into_iter().collect();
        for (pid, _, state) in crate::process::table() {
            if state != 'Z' && state != 'X' && cmdline(pid).contains(&dd) {
                roots.push(pid);
            }
        }
        with_descendants(&roots)
    }

    fn start_patroni(&mut self) -> Result<()> {
        if let Some(c) = self.patroni.as_mut() {
            if c.try_wait().map_err(|e| HarnessError::io("wait patroni", e))?.is_none() {
                return Err(HarnessError::Other(format!("{}: Patroni already runs", self.name)));
            }
        }
        let (out, err) = open_log(&self.log_path)?;
        let mut cmd = server_command("patroni", &self.dir, true)?;
        cmd.arg(&self.config_path).stdout(out).stderr(err);
        let child = cmd
            .spawn()
            .map_err(|e| HarnessError::io(format!("{}: spawn patroni", self.name), e))?;
        self.patroni = Some(child);
        Ok(())
    }

    /// SIGKILL Patroni and every PostgreSQL process of this member; returns their pids.
    fn kill_all(&mut self) -> Result<Vec<i32>> {
        // Stop everything first (nothing can fork or restart anything), then kill.
        let mut pids = self.processes();
        signal(&pids, libc::SIGSTOP);
        for p in self.processes() {
            if !pids.contains(&p) {
                signal(&[p], libc::SIGSTOP);
                pids.push(p);
            }
        }
        signal(&pids, libc::SIGKILL);
        if let Some(mut c) = self.patroni.take() {
            let _ = c.wait();
        }
        wait_gone(&pids, Duration::from_secs(30))?;
        Ok(pids)
    }
}

/// The processes of a frozen member (see [`PatroniCluster::freeze_member`]).
#[derive(Debug)]
pub struct Frozen {
    pub member: String,
    pub patroni: Vec<i32>,
    pub postgres: Vec<i32>,
    pub at: Instant,
}

impl Frozen {
    /// SIGCONT PostgreSQL's processes, wait `patroni_delay`, SIGCONT Patroni's. Returns the
    /// instant PostgreSQL woke.
    pub fn thaw(self, patroni_delay: Duration) -> Instant {
        signal(&self.postgres, libc::SIGCONT);
        let woke = Instant::now();
        std::thread::sleep(patroni_delay);
        signal(&self.patroni, libc::SIGCONT);
        woke
    }
}

/// etcd, and Patroni members (see the module documentation).
pub struct PatroniCluster {
    pub opts: PatroniOpts,
    pub scope: String,
    base: PathBuf,
    etcd: Option<Child>,
    etcd_port: u16,
    etcd_log: PathBuf,
    members: Vec<Member>,
}

impl std::fmt::Debug for PatroniCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PatroniCluster")
            .field("scope", &self.scope)
            .field("base", &self.base)
            .field("etcd_port", &self.etcd_port)
            .field(
                "members",
                &self.members.iter().map(|m| (&m.name, m.pg_port, m.api_port)).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl PatroniCluster {
    /// Start etcd and the members, bootstrap through the first, `CREATE EXTENSION tsoracle` on
    /// it, and return once every member streams and one is the synchronous standby.
    pub fn start(name: &str, opts: PatroniOpts) -> Result<PatroniCluster> {
        assert!(opts.members >= 2, "a Patroni cluster needs at least 2 members");
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let root = std::env::var_os("TSORACLE_TEST_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let safe: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .take(24)
            .collect();
        let base = root.join(format!("tso-patroni-{safe}-{}-{n}", std::process::id()));
        if base.exists() {
            return Err(HarnessError::Other(format!("{} already exists", base.display())));
        }
        make_dir(&base)?;
        let scope = format!("{safe}-{}-{n}", std::process::id());
        let etcd_port = pick_port()?;
        let mut cluster = PatroniCluster {
            opts,
            scope,
            etcd_log: base.join("etcd.log"),
            base,
            etcd: None,
            etcd_port,
            members: Vec::new(),
        };
        // From here on, Drop cleans up whatever was started; a failed bring-up shows the logs.
        match cluster.bring_up() {
            Ok(()) => Ok(cluster),
            Err(e) => {
                eprintln!(
                    "[patroni] bring-up failed: {e}\n[patroni] state: {}",
                    cluster.describe()
                );
                cluster.dump_logs(LOG_TAIL_LINES);
                Err(e)
            }
        }
    }

    fn bring_up(&mut self) -> Result<()> {
        let opts = self.opts.clone();
        self.start_etcd()?;
        for i in 0..opts.members {
            let name = format!("pg{}", i + 1);
            let dir = self.base.join(&name);
            make_dir(&dir)?;
            let m = Member {
                api_port: pick_port()?,
                pg_port: pick_port()?,
                data_dir: dir.join("data"),
                config_path: dir.join("patroni.yml"),
                log_path: dir.join("patroni.log"),
                dir,
                name,
                patroni: None,
            };
            let text = render_config(&self.member_config(&m), &opts);
            fs::write(&m.config_path, text)
                .map_err(|e| HarnessError::io("write patroni.yml", e))?;
            chown(&m.config_path)?;
            self.members.push(m);
        }

        // pg1 bootstraps and leads.
        let t0 = Instant::now();
        self.members[0].start_patroni()?;
        let leader = self.wait_leader(&[], BOOTSTRAP_TIMEOUT)?;
        if leader != 0 {
            return Err(HarnessError::Other(format!(
                "bootstrap: {} leads, not pg1",
                self.members[leader].name
            )));
        }
        let st = self.create_extension(0)?;
        eprintln!(
            "[patroni] {}: pg1 bootstrapped and serving (epoch {:?}) after {:.1} s",
            self.scope,
            st.epoch,
            t0.elapsed().as_secs_f64()
        );
        for i in 1..self.members.len() {
            self.members[i].start_patroni()?;
        }
        let others: Vec<usize> = (1..self.members.len()).collect();
        self.wait_replicas(0, &others, BOOTSTRAP_TIMEOUT)?;
        let sync = self.wait_sync(0, None, BOOTSTRAP_TIMEOUT)?;
        eprintln!(
            "[patroni] {}: {} members up, synchronous standby {}, after {:.1} s",
            self.scope,
            self.members.len(),
            self.members[sync].name,
            t0.elapsed().as_secs_f64()
        );
        Ok(())
    }

    fn member_config(&self, m: &Member) -> MemberConfig {
        MemberConfig {
            scope: self.scope.clone(),
            name: m.name.clone(),
            api_port: m.api_port,
            pg_port: m.pg_port,
            etcd: format!("127.0.0.1:{}", self.etcd_port),
            data_dir: m.data_dir.to_string_lossy().into_owned(),
            run_dir: m.dir.to_string_lossy().into_owned(),
            bin_dir: pg_bin_dir().to_string_lossy().into_owned(),
        }
    }

    fn start_etcd(&mut self) -> Result<()> {
        let peer = pick_port()?;
        let dir = self.base.join("etcd");
        make_dir(&dir)?;
        let (out, err) = open_log(&self.etcd_log)?;
        let client_url = format!("http://127.0.0.1:{}", self.etcd_port);
        let peer_url = format!("http://127.0.0.1:{peer}");
        let mut cmd = server_command("etcd", &self.base, true)?;
        cmd.args(["--name", "etcd1", "--data-dir"])
            .arg(&dir)
            .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args([
                "--initial-cluster",
                &format!("etcd1={peer_url}"),
                "--initial-cluster-state",
                "new",
            ])
            .args(["--initial-cluster-token", &self.scope])
            .arg(format!("--enable-v2={}", self.opts.dcs == Dcs::EtcdV2))
            .args(["--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn"])
            .stdout(out)
            .stderr(err);
        self.etcd = Some(cmd.spawn().map_err(|e| HarnessError::io("spawn etcd", e))?);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok((200, body)) = http(self.etcd_port, "GET", "/health", Duration::from_secs(1))
            {
                if body.contains("true") {
                    return Ok(());
                }
            }
            if let Some(c) = self.etcd.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    return Err(HarnessError::Other(format!(
                        "etcd exited ({status}):\n{}",
                        read_tail(&self.etcd_log, 40)
                    )));
                }
            }
            if Instant::now() > deadline {
                return Err(HarnessError::Timeout(format!(
                    "etcd not healthy in 30 s:\n{}",
                    read_tail(&self.etcd_log, 40)
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    // ---------------------------------------------------------------- accessors

    pub fn members(&self) -> &[Member] {
        &self.members
    }

    pub fn member(&self, i: usize) -> &Member {
        &self.members[i]
    }

    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.members.iter().position(|m| m.name == name)
    }

    /// Every member, in order: the hosts of [`PatroniCluster::conninfo`].
    pub fn hosts(&self) -> Vec<HostPort> {
        self.members.iter().map(Member::host).collect()
    }

    /// The libpq multi-host connection string applications use:
    /// `host=127.0.0.1,127.0.0.1,127.0.0.1 port=a,b,c ... target_session_attrs=read-write`.
    pub fn conninfo(&self) -> String {
        let hosts = vec!["127.0.0.1"; self.members.len()].join(",");
        let ports: Vec<String> = self.members.iter().map(|m| m.pg_port.to_string()).collect();
        format!(
            "host={hosts} port={} user=postgres dbname=postgres connect_timeout=2 target_session_attrs=read-write",
            ports.join(",")
        )
    }

    pub fn base_dir(&self) -> &Path {
        &self.base
    }

    /// The configuration file of member `i`, as written.
    pub fn config_text(&self, i: usize) -> Result<String> {
        fs::read_to_string(&self.members[i].config_path)
            .map_err(|e| HarnessError::io("read patroni.yml", e))
    }

    // ---------------------------------------------------------------- state

    /// The member holding the leader key, if any answers so.
    pub fn leader(&self) -> Option<usize> {
        (0..self.members.len()).find(|&i| self.members[i].is_leader())
    }

    /// The synchronous standby, if any answers so.
    pub fn sync_standby(&self) -> Option<usize> {
        (0..self.members.len()).find(|&i| self.members[i].is_sync_standby())
    }

    /// Wait until a member not in `exclude` holds the leader key; returns it.
    pub fn wait_leader(&self, exclude: &[usize], timeout: Duration) -> Result<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            for i in 0..self.members.len() {
                if !exclude.contains(&i) && self.members[i].is_leader() {
                    return Ok(i);
                }
            }
            if Instant::now() > deadline {
                return Err(HarnessError::Timeout(format!(
                    "no leader (other than {exclude:?}) after {timeout:?}: {}",
                    self.describe()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Wait until every member of `replicas` is a running replica (`GET /replica`) streaming
    /// from `leader` (`pg_stat_replication` on the leader, `state = 'streaming'`).
    pub fn wait_replicas(
        &self,
        leader: usize,
        replicas: &[usize],
        timeout: Duration,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut last: String;
        loop {
            let not_replica: Vec<&str> = replicas
                .iter()
                .filter(|&&i| !self.members[i].is_replica())
                .map(|&i| self.members[i].name.as_str())
                .collect();
            if not_replica.is_empty() {
                match self.streaming_from(leader) {
                    Ok(streaming) => {
                        let missing: Vec<&str> = replicas
                            .iter()
                            .map(|&i| self.members[i].name.as_str())
                            .filter(|n| !streaming.contains(&n.to_string()))
                            .collect();
                        if missing.is_empty() {
                            return Ok(());
                        }
                        last = format!(
                            "not streaming from {}: {missing:?}",
                            self.members[leader].name
                        );
                    }
                    Err(e) => last = e.to_string(),
                }
            } else {
                last = format!("not running replicas: {not_replica:?}");
            }
            if Instant::now() > deadline {
                return Err(HarnessError::Timeout(format!(
                    "replicas {replicas:?}: {last} after {timeout:?}; {}",
                    self.describe()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// application_name of the standbys streaming from member `i`.
    pub fn streaming_from(&self, i: usize) -> Result<Vec<String>> {
        let mut c = connect_one(self.members[i].pg_port, false, Duration::from_secs(5), 10_000)?;
        Ok(c.query(
            "SELECT application_name FROM pg_stat_replication WHERE state = 'streaming'",
            &[],
        )?
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect())
    }

    /// Wait until a member (`want`, or any) is the synchronous standby of `leader`: Patroni
    /// says so (`GET /sync`, i.e. it is in the `/sync` key) and the leader's
    /// `pg_stat_replication` shows it `sync`. Returns it.
    pub fn wait_sync(
        &self,
        leader: usize,
        want: Option<usize>,
        timeout: Duration,
    ) -> Result<usize> {
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        loop {
            let candidates: Vec<usize> = match want {
                Some(w) => vec![w],
                None => (0..self.members.len()).filter(|&i| i != leader).collect(),
            };
            for i in candidates {
                if !self.members[i].is_sync_standby() {
                    continue;
                }
                match connect_one(
                    self.members[leader].pg_port,
                    false,
                    Duration::from_secs(5),
                    10_000,
                )
                .and_then(|mut c| {
                    Ok(c.query_opt(
                        "SELECT sync_state FROM pg_stat_replication WHERE application_name = $1",
                        &[&self.members[i].name],
                    )?
                    .map(|r| r.get::<_, String>(0)))
                }) {
                    Ok(Some(s)) if s == "sync" => return Ok(i),
                    Ok(s) => last = format!("{} sync_state {s:?}", self.members[i].name),
                    Err(e) => last = e.to_string(),
                }
            }
            if Instant::now() > deadline {
                return Err(HarnessError::Timeout(format!(
                    "no synchronous standby {want:?} of {} after {timeout:?}; last: {last}; {}",
                    self.members[leader].name,
                    self.describe()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `CREATE EXTENSION IF NOT EXISTS tsoracle` on member `i`, then wait until it serves.
    pub fn create_extension(&self, i: usize) -> Result<TsoStatus> {
        let mut c = connect_one(self.members[i].pg_port, true, Duration::from_secs(10), 60_000)?;
        c.batch_execute("CREATE EXTENSION IF NOT EXISTS tsoracle")?;
        drop(c);
        self.wait_serving(i, Duration::from_secs(60))
    }

    /// Poll `tso_status()` on member `i` until it serves.
    pub fn wait_serving(&self, i: usize, timeout: Duration) -> Result<TsoStatus> {
        let deadline = Instant::now() + timeout;
        let mut last = String::from("no attempt");
        while Instant::now() < deadline {
            match connect_one(self.members[i].pg_port, false, Duration::from_secs(2), 10_000) {
                Ok(mut c) => match tso::status(&mut c) {
                    Ok(st) if st.state == "serving" => return Ok(st),
                    Ok(st) => last = format!("state {:?} ({:?})", st.state, st.detail),
                    Err(e) => last = pg_error_string(&e),
                },
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(HarnessError::Timeout(format!(
            "{} not serving after {timeout:?}; last: {last}",
            self.members[i].name
        )))
    }

    /// One line per member: REST role/state/timeline, postmaster pid.
    pub fn describe(&self) -> String {
        self.members
            .iter()
            .map(|m| match m.api_patroni() {
                Some(b) => format!(
                    "{}: role {} state {} timeline {} sync {}",
                    m.name,
                    json_field(&b, "role").unwrap_or_default(),
                    json_field(&b, "state").unwrap_or_default(),
                    json_field(&b, "timeline").unwrap_or_default(),
                    m.is_sync_standby()
                ),
                None => format!(
                    "{}: REST API not answering (postmaster {:?})",
                    m.name,
                    m.postmaster_pid()
                ),
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    // ---------------------------------------------------------------- faults and operations

    /// `patronictl switchover --leader <from> --candidate <to> --force`; returns its output.
    pub fn switchover(&self, from: usize, to: usize) -> Result<String> {
        let m = &self.members[from];
        let mut cmd = server_command("patronictl", &m.dir, false)?;
        cmd.arg("-c").arg(&m.config_path).args([
            "switchover",
            "--leader",
            &m.name,
            "--candidate",
            &self.members[to].name,
            "--force",
        ]);
        let out = run_cmd(cmd, Duration::from_secs(120))?;
        if out.contains("failed") || out.contains("Error") {
            return Err(HarnessError::Other(format!("patronictl switchover: {out}")));
        }
        Ok(out)
    }

    /// `patronictl list` (for diagnostics).
    pub fn patronictl_list(&self) -> String {
        let m = &self.members[0];
        match server_command("patronictl", &m.dir, false).and_then(|mut cmd| {
            cmd.arg("-c").arg(&m.config_path).arg("list");
            run_cmd(cmd, Duration::from_secs(30))
        }) {
            Ok(s) => s,
            Err(e) => format!("patronictl list failed: {e}"),
        }
    }

    /// SIGKILL member `i`'s Patroni and all of its PostgreSQL processes.
    pub fn kill9_member(&mut self, i: usize) -> Result<Vec<i32>> {
        self.members[i].kill_all()
    }

    /// SIGSTOP member `i`'s Patroni (first, with its descendants), then its postmaster and all
    /// the postmaster's children. Thaw with [`Frozen::thaw`].
    pub fn freeze_member(&self, i: usize) -> Result<Frozen> {
        let m = &self.members[i];
        let patroni_root = m
            .patroni_pid()
            .ok_or_else(|| HarnessError::Other(format!("{}: Patroni not running", m.name)))?;
        let pm = m
            .postmaster_pid()
            .ok_or_else(|| HarnessError::Other(format!("{}: no postmaster", m.name)))?;
        signal(&[patroni_root], libc::SIGSTOP);
        let patroni: Vec<i32> =
            with_descendants(&[patroni_root]).into_iter().filter(|&p| p != pm).collect();
        signal(&patroni, libc::SIGSTOP);
        signal(&[pm], libc::SIGSTOP);
        // The postmaster cannot fork any more: its children are all there.
        let postgres = with_descendants(&[pm]);
        signal(&postgres, libc::SIGSTOP);
        Ok(Frozen { member: m.name.clone(), patroni, postgres, at: Instant::now() })
    }

    /// SIGTERM member `i`'s Patroni (it stops its PostgreSQL, fast) and wait for it to exit.
    pub fn stop_member(&mut self, i: usize) -> Result<()> {
        let m = &mut self.members[i];
        let Some(mut child) = m.patroni.take() else {
            return Err(HarnessError::Other(format!("{}: Patroni not running", m.name)));
        };
        signal(&[child.id() as i32], libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if child.try_wait().map_err(|e| HarnessError::io("wait patroni", e))?.is_some() {
                break;
            }
            if Instant::now() > deadline {
                m.patroni = Some(child);
                m.kill_all()?;
                return Err(HarnessError::Timeout(format!(
                    "{}: Patroni did not stop in 90 s; killed",
                    m.name
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Patroni waits for its postmaster; make sure nothing is left.
        let left = m.processes();
        if !left.is_empty() {
            return Err(HarnessError::Other(format!(
                "{}: processes left after Patroni stopped: {left:?}",
                m.name
            )));
        }
        Ok(())
    }

    /// Start member `i`'s Patroni again (after a kill or a stop).
    pub fn start_member(&mut self, i: usize) -> Result<()> {
        self.members[i].start_patroni()
    }

    /// Wait until member `i` is a running replica streaming from `leader` (after a restart,
    /// a demotion, a rewind).
    pub fn wait_rejoined(&self, i: usize, leader: usize) -> Result<()> {
        self.wait_replicas(leader, &[i], REJOIN_TIMEOUT)
    }

    /// Print the tail of every member's log and of etcd's.
    pub fn dump_logs(&self, lines: usize) {
        for m in &self.members {
            eprintln!(
                "----- {} ({}): last {lines} lines -----\n{}\n----- end of {} -----",
                m.name,
                m.log_path.display(),
                read_tail(&m.log_path, lines),
                m.name
            );
        }
        eprintln!(
            "----- etcd: last 20 lines -----\n{}\n----- end of etcd -----",
            read_tail(&self.etcd_log, 20)
        );
    }
}

impl Drop for PatroniCluster {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        if panicking {
            eprintln!("[patroni] cluster state at the failure: {}", self.describe());
            self.dump_logs(LOG_TAIL_LINES);
        }
        // Frozen processes are killed like the others (SIGKILL works on stopped processes).
        for m in &mut self.members {
            if let Err(e) = m.kill_all() {
                eprintln!("[patroni] teardown of {}: {e}", m.name);
            }
        }
        if let Some(mut etcd) = self.etcd.take() {
            let _ = etcd.kill();
            let _ = etcd.wait();
        }
        let keep = panicking && std::env::var_os("TSORACLE_KEEP_FAILED").is_some_and(|v| v == "1");
        if keep {
            eprintln!("[patroni] keeping {}", self.base.display());
        } else {
            let _ = fs::remove_dir_all(&self.base);
        }
    }
}
