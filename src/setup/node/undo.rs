//! The undo: each recorded part taken out by itself, every other byte left, the engine
//! restarted once, the binaries removed when no container runs through them.

use super::*;

impl NodeSetup {
    /// Takes out what `state` records, each part by itself (see [`undo_part`]), and any copy of
    /// vramgate's runtime in containerd's files; removes the directories it made; restarts the
    /// engine when `restart` and an engine file changed; then removes the copied binaries
    /// once no container's shim runs the wrapper any more (waiting at most `wait`). Binaries
    /// still in use are kept: removing them would leave those containers impossible to stop
    /// or delete (their shim execs the wrapper for that), their memory reserved for ever. What
    /// is kept or could not be done is recorded in the state file for the next run.
    pub(super) fn restore(&mut self, state: &NodeState, wait: Duration, restart: bool) -> Undone {
        let mut undone = Undone::default();
        let view = self.options.view();
        let runtime = match &state.runtime {
            Some(runtime) => Some(runtime.clone()),
            None => self.options.runtime().ok(),
        };
        let mut parts = state.parts.clone();
        parts.extend(legacy_parts(state, &self.options, &view));
        let default_before = parts.iter().find_map(|p| match p {
            Part::Keys {
                default_before: Some(before),
                ..
            } => Some(before.clone()),
            _ => None,
        });
        let keys_files: Vec<PathBuf> = parts
            .iter()
            .filter_map(|p| match p {
                Part::Keys { config, .. } => Some(config.clone()),
                _ => None,
            })
            .collect();
        let own_files: Vec<PathBuf> = parts
            .iter()
            .filter_map(|p| match p {
                Part::File { path, .. } => Some(path.clone()),
                _ => None,
            })
            .collect();
        let mut engine_changed = false;
        let mut failed = Vec::new();
        match (runtime, load_chain(&self.options, &view)) {
            (Some(runtime), Ok(chain)) => {
                for file in &chain.files {
                    if own_files.contains(&self.host.host_path(&file.local)) {
                        continue;
                    }
                    let ours = keys_files.contains(&self.host.host_path(&file.local));
                    let before = default_before.as_ref().and_then(|d| d.as_deref());
                    match take_runtime_out(file, &runtime, before, ours) {
                        Ok(Some(line)) => {
                            engine_changed |= line.starts_with("took");
                            undone.report.push(line);
                        }
                        Ok(None) => {}
                        Err(e) => undone.left.push(e.to_string()),
                    }
                }
            }
            (_, Err(e)) => undone.left.push(format!(
                "did not look for vramgate's runtime in containerd's config: {e}"
            )),
            (None, _) => {}
        }
        let host_config = self.options.install_config.as_ref().map(|(_, target)| target.clone());
        for part in parts.iter().rev() {
            match undo_part(&self.host, part) {
                Ok(Some(line)) => {
                    let engine_file = !matches!(part, Part::File { path, .. } if Some(path) == host_config.as_ref());
                    engine_changed |= engine_file && !line.starts_with("left");
                    undone.report.push(line);
                }
                Ok(None) => {}
                Err(e) => {
                    undone.left.push(e.to_string());
                    failed.push(part.clone());
                }
            }
        }
        for dir in &state.dirs {
            let removed = self.host.resolve(dir).map(std::fs::remove_dir);
            match removed {
                Ok(Ok(())) => undone.report.push(format!("removed {}", dir.display())),
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
                // Something else was put there since: not ours to remove.
                Ok(Err(e)) => undone.report.push(format!("left {} ({e})", dir.display())),
                Err(e) => undone.left.push(e.to_string()),
            }
        }
        if restart && engine_changed && self.options.restart == RestartMode::Signal {
            match self.restart() {
                Ok(line) => undone.report.push(line),
                Err(e) => undone.left.push(format!("containerd was not restarted: {e}")),
            }
        }
        let users = self.wait_unused(wait).unwrap_or_else(|e| {
            undone.left.push(e.to_string());
            vec!["(unknown: the task directory could not be read)".into()]
        });
        if users.is_empty() {
            for binary in &state.binaries {
                match self.host.resolve(binary).map_err(NodeError::from).and_then(|p| {
                    remove_file(&p)?;
                    Ok(())
                }) {
                    Ok(()) => undone.report.push(format!("removed {}", binary.display())),
                    Err(e) => {
                        undone.left.push(e.to_string());
                        undone.kept.push(binary.clone());
                    }
                }
            }
        } else {
            undone.report.push(format!(
                "kept {}: {} container(s) still run through its vramgate-runtime ({})",
                self.options.install_dir.display(),
                users.len(),
                users.join(", ")
            ));
            undone.kept = state.binaries.clone();
        }
        let left = NodeState {
            parts: failed,
            files: Vec::new(),
            binaries: undone.kept.clone(),
            dirs: Vec::new(),
            created_dir: self.state.created_dir || state.created_dir,
            restarted: false,
            restart: state.restart,
            engine_socket: state.engine_socket.clone(),
            runtime: state.runtime.clone(),
        };
        let saved = self
            .host
            .resolve(&self.options.state_path())
            .map_err(NodeError::from)
            .and_then(|path| {
                if left.parts.is_empty() && left.binaries.is_empty() {
                    remove_file(&path)?;
                } else {
                    let bytes = serde_json::to_vec(&left).expect("the state serializes");
                    replace_file(&path, &bytes, 0o600)?;
                }
                Ok(())
            });
        if let Err(e) = saved {
            undone.left.push(e.to_string());
        }
        undone
    }

    /// The containers whose shim runs the copied wrapper, once there are none or `wait` has
    /// passed (polled every 200 ms).
    pub(super) fn wait_unused(&self, wait: Duration) -> NodeResult<Vec<String>> {
        let tasks = self.host.resolve(&self.options.engine_tasks)?;
        let runtime = self.options.runtime()?;
        let started = Instant::now();
        loop {
            let users = tasks_running(&tasks, &runtime)?;
            if users.is_empty() || started.elapsed() >= wait {
                return Ok(users);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Undoes the set-up: each part taken out, the engine restarted once more when that
    /// changed its files, and the binaries and (when it made it) the install directory
    /// removed once no container runs through them (see [`NodeSetup::restore`]). A directory
    /// that was there before is left as it was found.
    pub fn undo(mut self) -> Undone {
        let state = self.state.clone();
        let mut undone = self.restore(&state, self.options.wait, true);
        if !undone.kept.is_empty() {
            undone.report.push(format!(
                "stop those containers, then run the node set-up again (it removes what it kept) or remove {} yourself",
                self.options.install_dir.display()
            ));
        }
        if state.created_dir && undone.kept.is_empty() && undone.left.is_empty() {
            match self.host.resolve(&self.options.install_dir).map(std::fs::remove_dir) {
                Ok(Ok(())) => undone
                    .report
                    .push(format!("removed {}", self.options.install_dir.display())),
                // Something else was put there since: it is not ours to remove.
                Ok(Err(e)) => undone
                    .report
                    .push(format!("left {} ({e})", self.options.install_dir.display())),
                Err(e) => undone.left.push(e.to_string()),
            }
        }
        undone
    }
}

/// The parts a state file of a release before [`Part`] stands for: its entry in the main
/// config's imports (whatever else is there now stays), and its own files as they were.
fn legacy_parts(state: &NodeState, options: &NodeOptions, view: &EngineView) -> Vec<Part> {
    let entry = view
        .engine(&options.drop_in())
        .map(|p| p.to_string_lossy().into_owned());
    state
        .files
        .iter()
        .map(|saved| match (&entry, saved.path == options.engine_config) {
            (Ok(entry), true) => Part::Import {
                config: saved.path.clone(),
                entry: entry.clone(),
                created: None,
            },
            _ => Part::File {
                path: saved.path.clone(),
                before: saved.before.clone(),
                written: None,
            },
        })
        .collect()
}

/// Takes vramgate's runtime (the one running `runtime`) out of one file of containerd's
/// config, in place; a line when it did, or when it left another's.
fn take_runtime_out(
    file: &ChainFile,
    runtime: &Path,
    default_before: Option<&str>,
    ours: bool,
) -> NodeResult<Option<String>> {
    let mut text = file.text.clone();
    let mut line = None;
    for plugin in [CRI_PLUGIN, CRI_RUNTIME_PLUGIN_V3] {
        match without_runtime(&text, &file.local, plugin, &[runtime], default_before, ours)? {
            RuntimeOut::Removed(new) => {
                text = new;
                line = Some(format!(
                    "took the runtime {RUNTIME_NAME} out of {}",
                    file.engine.display()
                ));
            }
            RuntimeOut::Foreign(binary) => {
                line = Some(format!(
                    "left the runtime {RUNTIME_NAME} in {}: its BinaryName is {binary:?}, not vramgate's {}",
                    file.engine.display(),
                    runtime.display()
                ))
            }
            RuntimeOut::Absent => {}
        }
    }
    if text != file.text {
        write_file(&file.local, text.as_bytes(), 0o644)?;
    }
    Ok(line)
}

/// Takes one part out (host paths resolved inside `host`); a line saying what it did or why it
/// left the part, `None` when there was nothing to do.
fn undo_part(host: &HostRoot, part: &Part) -> NodeResult<Option<String>> {
    match part {
        Part::Import { config, entry, created } => {
            let local = host.resolve(config)?;
            let Some(bytes) = read_plain(&local)? else {
                return Ok(None);
            };
            if created.as_ref() == Some(&bytes) {
                remove_file(&local)?;
                return Ok(Some(format!("removed {}", config.display())));
            }
            let text = String::from_utf8(bytes).map_err(|_| SetupError::Parse {
                path: config.clone(),
                format: "UTF-8 TOML",
                message: "it is not UTF-8".into(),
            })?;
            if !imports_of(&text, config)?.iter().any(|i| i == entry) {
                return Ok(Some(format!("left {}: it no longer imports {entry}", config.display())));
            }
            write_file(&local, without_import(&text, entry).as_bytes(), 0o644)?;
            Ok(Some(format!("took {entry} out of {}'s imports", config.display())))
        }
        Part::Keys { config, runc, .. } => {
            // The runtime itself and the default's name went with every other copy.
            let local = host.resolve(config)?;
            let Some(bytes) = read_plain(&local)?.filter(|_| *runc) else {
                return Ok(None);
            };
            match without_added_runc(&String::from_utf8_lossy(&bytes), config)? {
                Some(text) => {
                    write_file(&local, text.as_bytes(), 0o644)?;
                    Ok(Some(format!(
                        "took the runtime {CONTAINERD_DEFAULT_RUNTIME} vramgate added out of {}",
                        config.display()
                    )))
                }
                None => Ok(None),
            }
        }
        Part::File { path, before, written } => {
            let local = host.resolve(path)?;
            let current = read_plain(&local)?;
            if current.is_none() && before.is_none() {
                return Ok(None);
            }
            if written.is_some() && current != *written {
                return Ok(Some(format!(
                    "left {}: it changed since vramgate wrote it (another tool or the admin); look at it and remove it yourself if it is no longer wanted",
                    path.display()
                )));
            }
            match before {
                Some(bytes) => {
                    let mode = std::fs::symlink_metadata(&local).map_or(0o644, |m| m.mode());
                    replace_file(&local, bytes, mode)?;
                    Ok(Some(format!("restored {}", path.display())))
                }
                None => {
                    remove_file(&local)?;
                    Ok(Some(format!("removed {}", path.display())))
                }
            }
        }
    }
}
