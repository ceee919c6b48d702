//! `completions` and `man`: the command line's own reference, generated
//! from the clap definitions so it cannot drift from what the binary parses.

use std::path::Path;

use super::{EXIT_OK, EXIT_USAGE};

/// Prints the completion script for `shell`, for the name this binary was
/// invoked as (`openmed-op` or `kubectl-openmed`).
pub fn completions(shell: clap_complete::Shell) -> u8 {
    let mut cmd = super::command();
    let name = cmd.get_name().to_owned();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, name, &mut out);
    super::exit_after(super::write_stdout(&out), EXIT_OK)
}

/// Prints the top page, or writes every page into `dir`: all pages are
/// rendered first, so a failure writes none.
pub fn man(dir: Option<&Path>) -> u8 {
    let cmd = super::command();
    let pages = match pages(&cmd) {
        Ok(pages) => pages,
        Err(e) => {
            eprintln!("openmed-op: cannot render the manual: {e}");
            return EXIT_USAGE;
        }
    };
    let Some(dir) = dir else {
        let (_, top) = &pages[0];
        return super::exit_after(super::write_stdout(top), EXIT_OK);
    };
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("openmed-op: {}: {e}", dir.display());
        return EXIT_USAGE;
    }
    for (file, page) in &pages {
        let path = dir.join(file);
        if let Err(e) = std::fs::write(&path, page) {
            eprintln!("openmed-op: {}: {e}", path.display());
            return EXIT_USAGE;
        }
    }
    eprintln!(
        "openmed-op: wrote {} pages into {}",
        pages.len(),
        dir.display()
    );
    EXIT_OK
}

/// `(file name, roff)` for the command and each subcommand, top first.
fn pages(cmd: &clap::Command) -> std::io::Result<Vec<(String, Vec<u8>)>> {
    let mut cmd = cmd.clone();
    cmd.build();
    let name = cmd.get_name().to_owned();
    let mut pages = Vec::new();
    let mut top = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut top)?;
    pages.push((format!("{name}.1"), top));
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let page_name = format!("{name}-{}", sub.get_name());
        let sub = sub.clone().name(page_name.clone());
        let mut page = Vec::new();
        clap_mangen::Man::new(sub).render(&mut page)?;
        pages.push((format!("{page_name}.1"), page));
    }
    Ok(pages)
}
