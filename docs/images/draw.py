#!/usr/bin/env python3
"""Draws the pictures of docs/concepts.md and README.md as SVG.

    docs/images/draw.py           write docs/images/*.svg
    docs/images/draw.py --check   exit 1 if a committed SVG differs from what this draws

The names in them (phases, Event reasons, a canary's weights, the fleet's
waves) are the product's: tests/docs.rs checks each against the code and
the examples, and that the committed files are what this script draws.
"""
import html
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DRAWN = {}

W=lambda s: html.escape(s)
STYLE='''<style>
text{font-family:'DejaVu Sans',Helvetica,Arial,sans-serif;font-size:13px;fill:#1f2328}
.title{font-size:15px;font-weight:bold}
.node{fill:#f6f8fa;stroke:#57606a;stroke-width:1.2}
.good{fill:#dafbe1;stroke:#1a7f37}
.bad{fill:#ffebe9;stroke:#cf222e}
.busy{fill:#ddf4ff;stroke:#0969da}
.wait{fill:#fff8c5;stroke:#9a6700}
.edge{stroke:#57606a;stroke-width:1.3;fill:none;marker-end:url(#arrow)}
.back{stroke:#cf222e;stroke-dasharray:5 3}
.small{font-size:11.5px;fill:#57606a}
.phase{font-weight:bold}
.reason{font-size:11.5px;fill:#0550ae;font-family:'DejaVu Sans Mono',Menlo,monospace}
.mono{font-family:'DejaVu Sans Mono',Menlo,monospace;font-size:12px}
</style>'''
DEFS='''<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#57606a"/></marker></defs>'''
def svg(w,h,title,body):
    return f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="{W(title)}">\n<title>{W(title)}</title>\n{STYLE}\n{DEFS}\n<rect width="{w}" height="{h}" fill="#ffffff"/>\n{body}\n</svg>\n'
def box(x,y,w,h,lines,cls='node',tcls=None,r=8):
    out=[f'<rect class="{cls if cls=="node" else "node "+cls}" x="{x}" y="{y}" width="{w}" height="{h}" rx="{r}"/>']
    n=len(lines); lh=16
    y0=y+h/2-(n-1)*lh/2+4.5
    for i,(t,c) in enumerate(lines):
        cc=f' class="{c}"' if c else ''
        out.append(f'<text{cc} x="{x+w/2}" y="{y0+i*lh:.1f}" text-anchor="middle">{W(t)}</text>')
    return '\n'.join(out)
def line(pts,cls='edge'):
    d='M'+' L'.join(f'{x},{y}' for x,y in pts)
    return f'<path class="{cls}" d="{d}"/>'
def text(x,y,t,c=None,anchor='middle'):
    cc=f' class="{c}"' if c else ''
    return f'<text{cc} x="{x}" y="{y}" text-anchor="{anchor}">{W(t)}</text>'


def save(name, content):
    DRAWN[name] = content


b=[]
b.append(text(20,28,'From a one-line bump in Git to pods that serve the new model','title','start'))
b.append(box(20,60,200,96,[('Git','phase'),('OpenMedModel','mono'),('version: …-v2','mono')]))
b.append(box(270,48,220,52,[('openmed-op render','mono'),('the exact change, in the PR','small')],'busy'))
b.append(box(270,116,220,52,[('openmed-op verify','mono'),('refuses unsafe changes','small')],'busy'))
b.append(box(540,60,190,96,[('Argo CD / Flux','phase'),('applies the merge','small')]))
b.append(line([(220,92),(268,74)])); b.append(line([(220,124),(268,142)]))
b.append(line([(490,74),(538,92)])); b.append(line([(490,142),(538,124)]))
# cluster
b.append('<rect x="20" y="196" width="710" height="250" rx="10" fill="none" stroke="#8c959f" stroke-dasharray="6 4"/>')
b.append(text(36,218,'the cluster','small','start'))
b.append(box(40,236,200,90,[('openmed-op run','mono'),('the operator','small'),('(leader-elected)','small')],'busy'))
b.append(line([(635,156),(635,180),(140,180),(140,234)]))
b.append(box(300,232,190,46,[('ConfigMap per version','small'),('(the manifest)','small')]))
b.append(box(300,290,190,60,[('Deployment','phase'),('preload pointer, served','small'),('set, manifest hash','small')]))
b.append(line([(240,262),(298,255)])); b.append(line([(240,300),(298,318)]))
b.append(box(540,236,170,110,[('pods','phase'),('warm the model','small'),('before /readyz,','small'),('then serve','small')],'good'))
b.append(line([(490,320),(538,300)]))
b.append(box(40,360,200,70,[('status and Events','phase'),('Ready, Soaked, RolledBack …','small')]))
b.append(line([(140,326),(140,358)]))
b.append(box(300,372,410,50,[('a new version that never warms: rolled back to the last good one','small'),('a canary: tried on a share of the traffic first (Gateway API)','small')],'wait'))
save('overview.svg',svg(750,466,'openmed-op: from Git to serving pods','\n'.join(b)))

# ---- phases ----
b=[]
b.append(text(20,30,'The phases of an OpenMedModel (status.phase), and what moves it from one to the next','title','start'))
b.append(text(20,50,'Events in blue, as kubectl get events shows them.','small','start'))
B={'Pending':(30,150,170,'node'),'RollingOut':(330,150,230,'busy'),'Ready':(740,150,170,'good'),
   'Failed':(30,400,170,'bad'),'RolledBack':(330,400,230,'wait'),'Canary':(740,400,170,'busy')}
for k,(x,y,w,c) in B.items(): b.append(box(x,y,w,48,[(k,'phase')],c))
L=lambda *p: b.append(line(list(p)))
T=lambda x,y,t,c='small',a='middle': b.append(text(x,y,t,c,a))
L((200,174),(328,174)); T(265,146,'a target, a version'); T(265,164,'RolloutStarted','reason')
L((560,164),(738,164)); T(650,140,'every pod Ready'); T(650,156,'RolloutSucceeded','reason')
L((740,186),(562,186)); T(650,204,'a bump')
L((860,198),(860,398)); T(850,282,'a bump with','small','end'); T(850,298,'spec.canary','small','end'); T(850,314,'CanaryStarted','reason','end')
L((770,400),(770,340),(530,340),(530,200)); T(650,316,'every step passed'); T(650,332,'CanaryPromoting','reason')
L((740,424),(562,424)); T(650,444,'analysis failed,'); T(650,458,'or aborted'); T(650,474,'CanaryAborted','reason')
L((370,198),(370,398)); T(382,238,'not Ready in time,','small','start'); T(382,254,'a crash loop, or','small','start'); T(382,270,'the quality gate','small','start'); T(382,292,'RolloutFailed','reason','start'); T(382,308,'RollbackSucceeded','reason','start')
L((335,198),(200,398)); T(30,262,'nothing to restore,','small','start'); T(30,278,'or rollbackOnFailure:','small','start'); T(30,294,'false','small','start'); T(30,314,'RollbackFailed','reason','start')
b.append(line([(910,174),(950,174),(950,500),(445,500),(445,450)],'edge back'))
T(700,520,'the soak failed, or openmed.ai/rollback-to'); T(700,536,'SoakFailed','reason')
T(20,570,'From RolledBack or Failed, Git naming the restored version again, or a new one, moves on. Beside the phase, the','small','start')
T(20,586,'conditions Ready, Progressing, Degraded, RolledBack and Soaked say the same for kstatus, Flux and Argo CD.','small','start')
save('phases.svg',svg(970,600,'The phases of an OpenMedModel','\n'.join(b)))
STYLE2=STYLE.replace('</style>','.stable{fill:#dafbe1;stroke:#1a7f37}\n.canary{fill:#ddf4ff;stroke:#0969da}\n</style>')
def svg2(w,h,title,body):
    return svg(w,h,title,body).replace(STYLE,STYLE2)
# ---- canary ----
b=[]
T=lambda x,y,t,c='small',a='middle': b.append(text(x,y,t,c,a))
T(20,30,'A canary (examples/canary): the share of the traffic each Deployment gets, step by step','title','start')
T(20,50,'The HTTPRoute\u2019s weights move only after the analysis passed the step before and the canary\u2019s pods are ready.','small','start')
cols=[('bump to v2','warming',0,'pods warm v2','CanaryWarming'),('step 1','10 % for 5m',10,'error rate < 1 %','CanaryWeightChanged'),('step 2','50 % for 10m',50,'error rate < 1 %','CanaryWeightChanged'),('promoted','stable rolls to v2',0,'route back to 100/0','CanaryPromoted')]
x0,y0,bw,bh,gap=40,110,170,200,40
for i,(head,sub,wt,check,ev) in enumerate(cols):
    x=x0+i*(bw+gap)
    T(x+bw/2,y0-28,head,'phase'); T(x+bw/2,y0-12,sub)
    ch=bh*wt/100
    sh=bh-ch
    lab_s='v2' if i==3 else 'v1'
    b.append(f'<rect class="stable" x="{x}" y="{y0}" width="{bw}" height="{sh}" rx="4"/>')
    T(x+bw/2,y0+sh/2-4,'stable Deployment','small'); T(x+bw/2,y0+sh/2+12,f'{lab_s} · {100-wt} %','small')
    if ch>0:
        b.append(f'<rect class="canary" x="{x}" y="{y0+sh}" width="{bw}" height="{ch}" rx="4"/>')
        T(x+bw/2,y0+sh+ch/2+4,f'canary v2 · {wt} %','small')
    T(x+bw/2,y0+bh+22,check); T(x+bw/2,y0+bh+38,ev,'reason')
    if i<3: b.append(line([(x+bw+4,y0+bh/2),(x+bw+gap-4,y0+bh/2)]))
# weight label encoded for the test
b.append(line([(x0+bw+gap+bw/2,y0+bh+48),(x0+bw+gap+bw/2,y0+bh+78)],'edge back'))
b.append(line([(x0+2*(bw+gap)+bw/2,y0+bh+48),(x0+2*(bw+gap)+bw/2,y0+bh+78),(x0+bw+gap+bw/2+2,y0+bh+78)],'edge back'))
b.append(box(x0+bw+gap-60,y0+bh+84,bw+120,60,[('aborted: 2 failed measurements, or abort','small'),('route back to 100/0, the canary drained','small'),('CanaryAborted','reason')],'bad'))
T(20,y0+bh+170,'With clients that name their model, the canary\u2019s share reaches the new pods but is answered by the version the client','small','start')
T(20,y0+bh+186,'names: the analysis then judges the pods, and only the quality gate judges the model (docs/canary.md).','small','start')
save('canary.svg',svg2(880,y0+bh+200,'A canary step by step','\n'.join(b)))

# ---- soak ----
b=[]
T(20,30,'A soak (rolloutStrategy.soakSeconds): a Ready version is judged a while longer','title','start')
y=90
b.append(box(40,y,150,80,[('v2 rolls','phase'),('RolloutStarted','reason')],'busy'))
b.append(box(200,y,140,80,[('every pod Ready','phase'),('RolloutSucceeded','reason'),('Soaked=False','small')],'good'))
b.append(box(350,y,300,80,[('soakSeconds','phase'),('restarts, readiness, the quality gate,','small'),('the canary\u2019s analysis, per pod of v2','small'),('Soaking','reason')],'wait'))
b.append(box(660,y,180,80,[('Soaked=True','phase'),('Soaked','reason'),('the next wave may start','small')],'good'))
b.append(line([(500,y+82),(500,y+140)],'edge back'))
b.append(box(330,y+142,340,62,[('a pod fails, or openmed.ai/soak-abort:','small'),('rolled back to v1; Git naming v1 again is Soaked at once','small'),('SoakFailed \u00b7 SoakAborted','reason')],'bad'))
T(20,y+238,'A bump during the soak is tried against v2 (the canary\u2019s stable side is the soaking version), and new pods keep serving v2.','small','start')
T(20,y+254,'Pods that could not be placed (a quota, the autoscaler\u2019s maximum) are capacity, shown in Degraded, not the version\u2019s failure.','small','start')
save('soak.svg',svg2(880,y+270,'A soak','\n'.join(b)))

# ---- fleet ----
b=[]
T(20,30,'Fleet waves (examples/fleet): one commit bumps every cluster\u2019s folder,','title','start'); T(20,50,'and each wave waits for the one before it to soak','title','start')
waves=['staging','hospital-a','hospital-b']
y=90
for i,wv in enumerate(waves):
    x=40+i*300
    b.append(box(x,y,210,150,[(wv,'phase'),('clusters/'+wv,'mono'),('Flux Kustomization','small'),('rolls, then soaks','small'),('Soaked=True','reason')],'busy' if i==0 else 'node'))
    if i<2:
        b.append(line([(x+212,y+75),(x+298,y+75)]))
        T(x+255,y+64,'Soaked=True','reason'); T(x+255,y+96,'dependsOn','small')
b.append(box(40,y+180,810,56,[('openmed-op render fleet/: the change wave by wave, in order \u00b7 openmed-op verify --status: a wave moved ahead of the one','small'),('before, or promoted before it soaked, is refused; after a rollback in any wave, one --fix sets every folder back','small')],'wait'))
T(20,y+270,'A failure in staging rolls staging back, and no hospital gets the version: its Kustomization never sees Soaked=True.','small','start')
save('fleet.svg',svg2(880,y+285,'Fleet waves','\n'.join(b)))


def main():
    check = sys.argv[1:] == ["--check"]
    stale = []
    for name, content in DRAWN.items():
        path = os.path.join(HERE, name)
        if check:
            try:
                with open(path, encoding="utf-8") as f:
                    if f.read() != content:
                        stale.append(name)
            except FileNotFoundError:
                stale.append(name)
        else:
            with open(path, "w", encoding="utf-8") as f:
                f.write(content)
    if stale:
        print("docs/images: not what draw.py draws: " + ", ".join(stale) + " (run docs/images/draw.py)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
